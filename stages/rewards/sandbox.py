"""Run untrusted Python (model-written code, math-verify on model-written answers) where the
operating system, not Python, keeps it from the machine, the run and its own verdict.

Two isolation levels; a recipe names the one it accepts (`sandbox.isolation`):

- `bwrap` (the default): bubblewrap puts the interpreter in new PID, network, mount, IPC and UTS
  namespaces. As root the sandboxed interpreter is then switched (setpriv) to the real host
  uid/gid 65534 with no capabilities, no supplementary groups and no_new_privs; as an ordinary
  user bubblewrap also makes a new user namespace mapping that user to 65534. The filesystem is
  a fresh tmpfs holding only read-only binds of /usr (and the /lib, /bin links), the
  interpreter's installation (and, for math, the virtualenv's libraries), a minimal /dev, a
  /proc of its own PID namespace and a small private writable tmpfs as working directory:
  nothing of the caller's files, environment or processes is visible. No network at all (an
  empty namespace, and sockets refused by seccomp).
- `process`: a fresh `python -I` in its own session with a scrubbed environment, a throwaway
  working directory and a PEP 578 audit hook. Python documents audit hooks as no boundary:
  code in the same interpreter can switch the hook off. This level only stops accidents; a
  recipe must accept it explicitly.

Both levels: a seccomp filter (libseccomp through pyseccomp) loaded by the trusted prelude
before any untrusted byte is read refuses new processes (fork, vfork, clone without
CLONE_THREAD, execve), ptrace and cross-process memory access, mount and namespace calls,
sockets, kernel keyrings, BPF and perf; signals only to itself. Resource limits: CPU seconds,
address space, file size (which also caps captured output), open files, no core dumps; a
wall-clock timeout kills the whole process group (with bwrap the PID namespace dies with it).

A crash, a refusal, a limit hit or a timeout is a failed run, reported, never raised. The
sandbox decides nothing: callers send in only what must be computed and judge the plain data
that comes out (stages/rewards/code_tests.py, stages/rewards/math_grading.py).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

Isolation = Literal["bwrap", "process"]
ISOLATION_LEVELS: tuple[Isolation, ...] = ("bwrap", "process")
SANDBOX_UID = 65534  # "nobody"
_WORKDIR = "/sandbox"  # the private tmpfs inside the bwrap sandbox
_TOOLS = "/opt/far-sandbox"  # where the seccomp bindings are bound read-only inside it

# Runs first in the child: limits, trusted imports, seccomp (and, at the `process` level, the
# audit hook), then the untrusted source read from stdin. Nothing after the filter is loaded
# can undo it.
_PRELUDE = r"""
import os, sys, resource, importlib
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
    for _call in ("kill", "tgkill"):
        f.add_rule(sc.ERRNO(errno.EPERM), _call, sc.Arg(0, sc.NE, os.getpid()))
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
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
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
    site_packages: bool = False  # True for math-verify; code tests use the stdlib only
    preload: tuple[str, ...] = ()  # trusted modules imported before seccomp and the source


@dataclass(frozen=True)
class SandboxResult:
    returncode: int | None  # None: killed by the wall-clock timeout
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _seccomp_dir() -> str:
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
    seccomp = _seccomp_dir()
    common = [
        "--die-with-parent",
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
    if os.geteuid() == 0:  # real host uid 65534, no capabilities, before Python starts
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        drop = [
            "/usr/bin/setpriv",
            f"--reuid={SANDBOX_UID}",
            f"--regid={SANDBOX_UID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
        ]
        caps = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        return ["bwrap", *namespaces, *caps, *common, "--", *drop, *python]
    ids = ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    return ["bwrap", "--unshare-all", *ids, *common, "--", *python]


def _command(limits: Limits, isolation: Isolation, workdir: str) -> list[str]:
    flags = ["-I"] if limits.site_packages else ["-I", "-S"]
    if isolation == "bwrap":  # the virtualenv is bound only when its libraries are wanted
        executable = sys.executable if limits.site_packages else os.path.realpath(sys.executable)
        python = [executable, *flags, "-c", _prelude(limits, isolation, _TOOLS)]
        return bwrap_command(limits, python)
    return [sys.executable, *flags, "-c", _prelude(limits, isolation, _seccomp_dir())]


def run_python(
    source: str, limits: Limits | None = None, isolation: Isolation = "bwrap"
) -> SandboxResult:
    """Run `source` in the sandbox; never raises for anything the source does."""
    limits = limits or Limits()
    workdir = tempfile.mkdtemp(prefix="far-sandbox-")  # outputs (and the `process` cwd)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                _command(limits, isolation, workdir),
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
            timed_out = _wait(proc, source, limits.wall_seconds)
            out.seek(0)
            err.seek(0)
            stdout = out.read(limits.file_bytes).decode("utf-8", "replace")
            stderr = err.read(limits.file_bytes).decode("utf-8", "replace")
        return SandboxResult(None if timed_out else proc.returncode, stdout, stderr, timed_out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _wait(proc: subprocess.Popen[bytes], source: str, wall_seconds: float) -> bool:
    """Feed the source, wait; on timeout kill the whole process group. True when timed out."""
    try:
        proc.communicate(source.encode("utf-8", "replace"), timeout=wall_seconds)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # bwrap's --die-with-parent takes its PID namespace
        proc.wait()
        return True


def run_many(
    sources: Sequence[str],
    limits: Limits | None = None,
    isolation: Isolation = "bwrap",
    workers: int | None = None,
) -> list[SandboxResult]:
    """Run each source in its own sandbox, `workers` at a time (default: one per CPU)."""
    if not sources:
        return []
    count = max(1, min(len(sources), workers or os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="far-sandbox") as pool:
        return list(pool.map(lambda s: run_python(s, limits, isolation), sources))


def missing_isolation(isolation: Isolation) -> str | None:
    """What keeps `isolation` from working on this machine (None when it works)."""
    if importlib.util.find_spec("pyseccomp") is None:
        return "pyseccomp (the libseccomp bindings, a FAR dependency) is not installed"
    if isolation == "process":
        return None
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = run_python("print('isolated')", Limits(cpu_seconds=5, wall_seconds=30), "bwrap")
    if probe.stdout != "isolated\n":
        reason = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"bubblewrap cannot create the sandbox here ({reason}); user namespaces off?"
    return None
