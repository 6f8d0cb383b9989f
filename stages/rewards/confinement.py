"""The operating system's hold on a sandboxed interpreter: the command line that starts it
confined, at the isolation level a recipe accepts (`sandbox.isolation`), with its limits set and
its system calls filtered before any untrusted byte is read.

Two isolation levels; a recipe names the one it accepts (`sandbox.isolation`):

- `bwrap` (the default): bubblewrap puts the interpreter in new PID, network, mount, IPC and UTS
  namespaces, under a trusted init of FAR's own as PID 1 (`_INIT`). That init keeps the
  caller's uid and bubblewrap's parent-death signal (`--die-with-parent`): however the grader
  dies (SIGKILL included), bubblewrap dies, then the init, and the kernel kills everything in
  the namespace with it. (The sandboxed interpreter cannot be PID 1 itself: under a uid of its
  own it cannot be sent that signal by bubblewrap, which has no capabilities, so the kernel
  drops it and the interpreter lives on.) The init waits for the interpreter and exits with
  its status, so the interpreter's CPU time reaches the caller's wait4 (bubblewrap's own init
  would not pass it on). As root the sandboxed interpreter is then switched (setpriv) to a
  host uid of its
  own (RLIMIT_NPROC counts tasks per uid: the cap is then per sandbox) and gid 65534 with no
  capabilities, no supplementary groups and no_new_privs; as an ordinary user bubblewrap also
  makes a new user namespace mapping that user to 65534 (where the count is per namespace).
  The filesystem is a fresh tmpfs holding only read-only binds of /usr (and the /lib, /bin
  links), the interpreter's installation (and, for math, the virtualenv's libraries), a
  minimal /dev, a /proc of its own PID namespace and a small private writable tmpfs as
  working directory:
  nothing of the caller's files, environment or processes is visible. No network at all (an
  empty namespace, and sockets refused by seccomp).
- `process`: a fresh `python -s -P` in its own session with a scrubbed environment, a throwaway
  working directory and a PEP 578 audit hook. Python documents audit hooks as no boundary:
  code in the same interpreter can switch the hook off. This level only stops accidents; a
  recipe must accept it explicitly.

Both levels: a seccomp filter (libseccomp through pyseccomp) loaded by the trusted prelude
before any untrusted byte is read refuses new processes (fork, vfork, clone without
CLONE_THREAD, execve), ptrace and cross-process memory access, mount and namespace calls,
sockets, kernel keyrings, BPF and perf, the calls that pin memory outside RLIMIT_AS (System V
shared memory and message queues, memfd, POSIX queues, mlock, io_uring); `kill`, and signals
other than to itself. Resource limits: CPU seconds, address space, file size (which also caps
its stderr), open files, tasks (bwrap), no core dumps.
Every sandbox has the same hash seed and no address randomization, so the same source
computes the same values.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import sys
from dataclasses import dataclass
from typing import Literal

Isolation = Literal["bwrap", "process"]
ISOLATION_LEVELS: tuple[Isolation, ...] = ("bwrap", "process")
SANDBOX_UID = 65534  # "nobody"
_WORKDIR = "/sandbox"  # the private tmpfs inside the bwrap sandbox
_TOOLS = "/opt/far-sandbox"  # where the seccomp bindings are bound read-only inside it
_UID_BASE, _UID_RANGE = 1 << 30, 1 << 24  # per-sandbox host uids (bwrap as root)
# Determinism: one hash seed for str/bytes hashing (set iteration order) and no address-space
# randomization (id()-based orders) in every sandbox, so the same source computes the same
# values in any process
HASH_SEED = "0"
_FIXED_LAYOUT = ["/usr/bin/setarch", "-R"] if os.path.exists("/usr/bin/setarch") else []

# Runs first in the child: limits, trusted imports, seccomp (and, at the `process` level, the
# audit hook), then the untrusted source read from stdin. Nothing after the filter is loaded
# can undo it.
_PRELUDE = r"""
import os, sys, resource, importlib, ctypes
ctypes.CDLL("libc.so.6").prctl(1, 9)  # PR_SET_PDEATHSIG SIGKILL: die with the process above
for _name, _value in LIMITS:
    resource.setrlimit(getattr(resource, _name), (_value, _value))
for _module in PRELOAD:
    importlib.import_module(_module)

def _load_seccomp():
    import ctypes.util, errno
    _names = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}
    ctypes.util.find_library = _names.get  # no ldconfig subprocess
    sys.path.insert(0, SECCOMP_DIR)
    try:
        import pyseccomp as sc
    finally:
        sys.path.remove(SECCOMP_DIR)
    f = sc.SyscallFilter(sc.ALLOW)
    for _call in DENIED_SYSCALLS:
        try:
            f.add_rule(sc.ERRNO(errno.EPERM), _call)
        except Exception:
            pass  # not a system call on this architecture
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # glibc falls back to clone, checked below
    f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, 0x10000, 0))
    f.add_rule(sc.ERRNO(errno.EPERM), "tgkill", sc.Arg(0, sc.NE, os.getpid()))
    f.load()
    for _m in [m for m in sys.modules if m == "pyseccomp"]:
        del sys.modules[_m]

_load_seccomp()
del _load_seccomp
AUDIT_HOOK
_source = sys.stdin.read()
sys.stdin = open(os.devnull)
exec(compile(_source, "<sandboxed>", "exec"), {"__name__": "__main__"})
"""

DENIED_SYSCALLS = (
    "execve",
    "execveat",
    "fork",
    "vfork",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "tkill",
    "kill",  # signals only to itself (tgkill, below), never to PID 1 (`_INIT`)
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # memory a process can pin outside its address-space limit (RLIMIT_AS): System V shared
    # memory and message queues outlive every mapping, memfd and POSIX queues hold pages by fd,
    # locked pages cannot be reclaimed
    "shmget",
    "shmat",
    "shmctl",
    "msgget",
    "msgsnd",
    "mq_open",
    "memfd_create",
    "memfd_secret",
    "mlock",
    "mlock2",
    "mlockall",
    "personality",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "reboot",
    "swapon",
    "swapoff",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "pidfd_open",
    "pidfd_getfd",
    "process_madvise",
    "name_to_handle_at",
    "open_by_handle_at",
)

# The `process` level's audit hook: refuses what it can see, but lives in the same interpreter.
_AUDIT_HOOK = r"""
_CWD = os.path.realpath(os.getcwd())
_ALLOWED_READ = tuple({os.path.realpath(p) for p in
    (_CWD, sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path) if p})

def _inside(path, roots):
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return any(real == r or real.startswith(r + os.sep) for r in roots)

def _hook(event, args):
    if event.startswith(("socket.", "ctypes.", "os.exec", "os.spawn", "os.fork", "os.kill")) \
            or event in ("os.system", "os.posix_spawn", "subprocess.Popen", "sys._current_frames"):
        raise PermissionError(f"sandbox refused {event}")
    if event == "open" and args[0] is not None and not isinstance(args[0], int):
        writing = any(c in str(args[1] or "r") for c in "wax+") or (args[2] or 0) & 3
        if not _inside(args[0], (_CWD,) if writing else (*_ALLOWED_READ, "/dev/null")):
            raise PermissionError(f"sandbox refused opening {args[0]!r}")
    if event in ("os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.utime", "os.chmod"):
        if args and not isinstance(args[0], int) and not _inside(args[0], (_CWD,)):
            raise PermissionError(f"sandbox refused {event} on {args[0]!r}")
    if event == "os.rename" and not all(_inside(a, (_CWD,)) for a in args[:2]):
        raise PermissionError(f"sandbox refused {event}")

sys.addaudithook(_hook)
"""


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 1 << 30
    file_bytes: int = 1 << 20  # also caps captured stdout/stderr
    open_files: int = 64
    workdir_bytes: int = 16 << 20  # the private tmpfs (bwrap)
    tasks: int = 32  # processes and threads (RLIMIT_NPROC of the sandbox's own uid; bwrap)
    site_packages: bool = False  # True for math-verify; code tests use the stdlib only
    preload: tuple[str, ...] = ()  # trusted modules imported before seccomp and the source


def seccomp_dir() -> str:
    spec = importlib.util.find_spec("pyseccomp")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyseccomp (libseccomp bindings) is not installed")
    return os.path.dirname(spec.origin)


def _prelude(limits: Limits, isolation: Isolation, seccomp_dir: str) -> str:
    rlimits = [
        ("RLIMIT_CPU", limits.cpu_seconds),
        ("RLIMIT_AS", limits.memory_bytes),
        ("RLIMIT_FSIZE", limits.file_bytes),
        ("RLIMIT_NOFILE", limits.open_files),
        ("RLIMIT_CORE", 0),
    ]
    if isolation == "bwrap":  # counted per uid: the sandbox's own (see bwrap_command)
        rlimits.append(("RLIMIT_NPROC", limits.tasks))
    return (
        _PRELUDE.replace("PRELOAD", repr(limits.preload))
        .replace("LIMITS", repr(rlimits))
        .replace("SECCOMP_DIR", repr(seccomp_dir))
        .replace("DENIED_SYSCALLS", repr(DENIED_SYSCALLS))
        .replace("AUDIT_HOOK", _AUDIT_HOOK if isolation == "process" else "")
    )


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _python_binds(limits: Limits) -> list[str]:
    roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    if limits.site_packages:
        roots |= {sys.prefix, os.path.realpath(sys.prefix)}
    args: list[str] = []
    for root in sorted(roots):
        if not root.startswith("/usr/"):
            parents = [p for p in _ancestors(root) if p != "/"]
            args += [a for p in parents for a in ("--perms", "0755", "--dir", p)]
            args += ["--ro-bind", root, root]
    return args


def _ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/', '/a', '/a/b'] (made traversable inside the sandbox)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def bwrap_command(limits: Limits, python: list[str]) -> list[str]:
    """The bubblewrap command line that runs `python` (argv) in the `bwrap` sandbox."""
    seccomp = seccomp_dir()
    common = [
        "--die-with-parent",  # PID 1 (`_INIT`, same uid) gets SIGKILL when bubblewrap dies
        "--new-session",
        "--clearenv",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "HOME",
        _WORKDIR,
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "PYTHONHASHSEED",
        HASH_SEED,
        *_system_binds(),
        *_python_binds(limits),
        "--perms",
        "0755",
        "--dir",
        _TOOLS,
        "--ro-bind",
        os.path.join(seccomp, "pyseccomp.py"),
        f"{_TOOLS}/pyseccomp.py",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(limits.workdir_bytes),
        "--perms",
        "1777",
        "--tmpfs",
        _WORKDIR,
        "--chdir",
        _WORKDIR,
    ]
    if os.geteuid() == 0:  # a host uid of its own, no capabilities, before Python starts
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        namespaces += ["--as-pid-1"]
        drop = [
            *_FIXED_LAYOUT,
            "/usr/bin/setpriv",
            f"--reuid={sandbox_uid()}",
            f"--regid={SANDBOX_UID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
        ]
        caps = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        return ["bwrap", *namespaces, *caps, *common, "--", *_init(), *drop, *python]
    ids = ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    sandboxed = [*_FIXED_LAYOUT, *python]
    return ["bwrap", "--unshare-all", "--as-pid-1", *ids, *common, "--", *_init(), *sandboxed]


# PID 1 of the bwrap sandbox: trusted, with the caller's uid (so bubblewrap's parent-death
# SIGKILL reaches it; its death ends the namespace). It starts the command after it, waits for
# it and exits with its status (128 + signal when killed, as bubblewrap reports), holding none
# of its pipes.
_INIT = r"""
import os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execv(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
_, status = os.waitpid(pid, 0)
os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
"""


def _init() -> list[str]:
    return [os.path.realpath(sys.executable), "-I", "-S", "-c", _INIT]


def sandbox_uid() -> int:
    """A host uid for one sandbox (bwrap as root). RLIMIT_NPROC counts a uid's tasks across
    the host, so each sandbox gets a uid of its own from a range no account uses: its task cap
    is then its own, whatever other sandboxes (of this run or another) do meanwhile."""
    return _UID_BASE + secrets.randbelow(_UID_RANGE)


def command(limits: Limits, isolation: Isolation, workdir: str) -> list[str]:
    # -s -P (not -I): like -I, no user site-packages and no script directory on sys.path, but
    # PYTHONHASHSEED is read; the environment is the sandbox's own (cleared) either way
    flags = ["-s", "-P"] if limits.site_packages else ["-s", "-P", "-S"]
    if isolation == "bwrap":  # the virtualenv is bound only when its libraries are wanted
        executable = sys.executable if limits.site_packages else os.path.realpath(sys.executable)
        python = [executable, *flags, "-c", _prelude(limits, isolation, _TOOLS)]
        return bwrap_command(limits, python)
    prelude = _prelude(limits, isolation, seccomp_dir())
    return [*_FIXED_LAYOUT, sys.executable, *flags, "-c", prelude]
