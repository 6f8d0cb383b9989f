"""Run untrusted Python (model-generated code, SymPy on model-written math) in a separate
process that cannot hurt the machine or the run.

Layers, each tested with hostile snippets (tests/unit/test_sandbox.py):
- a fresh interpreter (-I: no user site, no PYTHON* variables) with a scrubbed environment,
  in a throwaway working directory that is deleted afterwards;
- resource limits: CPU seconds, address space, file size, open files, no core dumps;
  a wall-clock timeout that kills the whole process group;
- no network: a new, empty network namespace where the OS allows it (root on Linux), and in
  any case an audit hook that refuses sockets;
- an audit hook, installed before the untrusted code runs, that refuses starting processes
  (fork, exec, spawn, os.system, subprocess), loading native code (ctypes), writing or
  deleting files outside the working directory, and reading files outside it and Python's
  own installation (so /proc/*/environ and secrets on disk stay closed).
A crash, a refusal, a limit hit or a timeout is a failed run, reported, never raised.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# Runs first in the child (single-threaded, so no fork-safety concerns): leave the network
# namespace, set limits, arm the audit hook, then execute the source read from stdin.
_PRELUDE = r"""
import os, sys, resource
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).unshare(0x40000000)  # CLONE_NEWNET; needs privileges
except Exception:
    pass  # without it the audit hook below still refuses sockets
finally:
    sys.modules.pop("ctypes", None)
for _name, _value in LIMITS:
    resource.setrlimit(getattr(resource, _name), (_value, _value))
_ALLOWED_READ = tuple({os.path.realpath(p) for p in
    (os.getcwd(), sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path) if p})
_CWD = os.path.realpath(os.getcwd())
_BLOCKED_EVENTS = {"os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn",
    "os.spawn", "subprocess.Popen", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym",
    "ctypes.cdata", "os.kill", "os.killpg", "signal.pthread_kill", "os.chmod", "os.chown",
    "os.link", "os.symlink", "shutil.chown", "os.truncate", "sys._current_frames"}
_BLOCKED_MODULES = {"ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "cffi"}
_PATH_EVENTS = {"os.remove", "os.rmdir", "os.rename", "os.mkdir", "shutil.rmtree",
    "shutil.copyfile", "shutil.move", "os.utime"}
_LIST_EVENTS = {"os.listdir", "os.scandir"}

def _inside(path, roots):
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return any(real == r or real.startswith(r + os.sep) for r in roots)

def _hook(event, args):
    if event in _BLOCKED_EVENTS or event.startswith(("socket.", "ctypes.")):
        raise PermissionError(f"sandbox refused {event}")
    if event == "import" and args[0].split(".")[0] in _BLOCKED_MODULES:
        raise PermissionError(f"sandbox refused import {args[0]}")
    if event == "open" and args[0] is not None and not isinstance(args[0], int):
        mode = str(args[1] or "r")
        writing = any(c in mode for c in "wax+")
        if not _inside(args[0], (_CWD,) if writing else (_CWD, *_ALLOWED_READ, "/dev/null",
                                                         "/dev/urandom")):
            raise PermissionError(f"sandbox refused opening {args[0]!r} ({mode})")
    if event in _PATH_EVENTS | _LIST_EVENTS and args and args[0] is not None \
            and not isinstance(args[0], int):
        roots = (_CWD,) if event in _PATH_EVENTS else (_CWD, *_ALLOWED_READ)
        if not _inside(args[0], roots):
            raise PermissionError(f"sandbox refused {event} on {args[0]!r}")

import importlib
for _module in PRELOAD:  # trusted imports (e.g. SymPy, which loads ctypes) before arming
    importlib.import_module(_module)
_source = sys.stdin.read()
sys.addaudithook(_hook)
sys.stdin = open(os.devnull)
exec(compile(_source, "<sandboxed>", "exec"), {"__name__": "__main__"})
"""


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 1 << 30
    file_bytes: int = 1 << 20  # also caps captured stdout/stderr
    open_files: int = 64
    site_packages: bool = False  # True for the SymPy checker; code tests use the stdlib only
    preload: tuple[str, ...] = ()  # trusted modules imported before the audit hook is armed


@dataclass(frozen=True)
class SandboxResult:
    returncode: int | None  # None: killed by the wall-clock timeout
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _prelude(limits: Limits) -> str:
    rlimits = [
        ("RLIMIT_CPU", limits.cpu_seconds),
        ("RLIMIT_AS", limits.memory_bytes),
        ("RLIMIT_FSIZE", limits.file_bytes),
        ("RLIMIT_NOFILE", limits.open_files),
        ("RLIMIT_CORE", 0),
    ]
    return _PRELUDE.replace("PRELOAD", repr(limits.preload)).replace("LIMITS", repr(rlimits))


def run_python(source: str, limits: Limits | None = None) -> SandboxResult:
    """Run `source` in the sandbox; never raises for anything the source does."""
    limits = limits or Limits()
    workdir = tempfile.mkdtemp(prefix="far-sandbox-")
    flags = ["-I"] if limits.site_packages else ["-I", "-S"]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    try:
        with (
            open(os.path.join(workdir, ".out"), "w+b") as out,
            open(os.path.join(workdir, ".err"), "w+b") as err,
        ):
            proc = subprocess.Popen(
                [sys.executable, *flags, "-c", _prelude(limits)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.communicate(source.encode("utf-8", "replace"), timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.seek(0)
            err.seek(0)
            stdout = out.read(limits.file_bytes).decode("utf-8", "replace")
            stderr = err.read(limits.file_bytes).decode("utf-8", "replace")
        return SandboxResult(None if timed_out else proc.returncode, stdout, stderr, timed_out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
