"""Run untrusted Python (model-written code, math-verify on model-written answers) where the
operating system, not Python, keeps it from the machine, the run and its own verdict
(stages/rewards/confinement.py says how; stages/rewards/process_tree.py watches it from outside).

A wall-clock timeout, a backstop for a blocked process, kills it from outside (with bwrap the
PID namespace dies with it). `run_many` runs one computing sandbox per CPU: a sandbox blocked
for IDLE_SECONDS (no task runnable, no CPU used) gives its place to the next while it waits for
that timeout, so sandboxes that sleep (ignoring every alarm) cost their wall-clock limit once,
side by side, not one after another.

The parent reads at most `file_bytes` of stdout, and notes the sandbox's CPU time (read from
/proc, outside the sandbox's reach) when each line arrives: callers judge time limits on those
numbers (stages/rewards/code_harness.py), not on anything the sandbox says about itself.

A crash, a refusal, a limit hit, a timeout or a sandbox the host cannot start is a failed run,
reported, never raised. The sandbox decides nothing: callers send in only what must be
computed and judge the plain data that comes out (stages/rewards/code_tests.py,
stages/rewards/math_grading.py).
"""

from __future__ import annotations

import importlib.util
import os
import selectors
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from stages.rewards.confinement import HASH_SEED, Isolation, Limits, command
from stages.rewards.process_tree import any_runnable, kill_tree, reap, tree_cpu


@dataclass(frozen=True)
class SandboxResult:
    returncode: int | None  # None: killed by the wall-clock timeout, or never started
    stdout: str
    stderr: str
    timed_out: bool
    # CPU seconds the whole sandbox had used when the parent read each complete stdout line
    # (one per newline-ended line of stdout, in order), measured by the kernel from outside
    line_cpu: tuple[float, ...] = ()
    cpu_seconds: float = 0.0  # its total CPU time, from wait4's rusage
    started: bool = True  # False: the host could not start it (e.g. EAGAIN, no bwrap)

    @property
    def ok(self) -> bool:
        return self.started and self.returncode == 0 and not self.timed_out


def run_python(
    source: str, limits: Limits | None = None, isolation: Isolation = "bwrap"
) -> SandboxResult:
    """Run `source` in the sandbox; never raises for anything the source does, nor when the
    host cannot start it (then `started` is False)."""
    return _run(source, limits or Limits(), isolation, _Slot(None))


def _run(source: str, limits: Limits, isolation: Isolation, slot: _Slot) -> SandboxResult:
    workdir = tempfile.mkdtemp(prefix="far-sandbox-")  # outputs (and the `process` cwd)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    env["PYTHONHASHSEED"] = HASH_SEED
    try:
        with tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(
                    command(limits, isolation, workdir),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    cwd=workdir,
                    env=env,
                    start_new_session=True,
                )
            except OSError as e:  # EAGAIN, ENOMEM, a missing executable: this run only
                return SandboxResult(None, "", f"not started: {e}", False, started=False)
            out = _Output(limits.file_bytes)
            timed_out = _exchange(proc, source.encode("utf-8", "replace"), out, limits, slot)
            cpu = reap(proc)
            err.seek(0)
            stderr = err.read(limits.file_bytes).decode("utf-8", "replace")
        stdout = bytes(out.data).decode("utf-8", "replace")
        stamps = tuple(cpu if s is None else min(s, cpu) for s in out.stamps)
        code = None if timed_out else proc.returncode
        return SandboxResult(code, stdout, stderr, timed_out, stamps, cpu)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _Output:
    """The sandbox's stdout, at most `limit` bytes, with the sandbox's CPU time when each
    complete line arrived (None: it had exited by then; its total is used instead)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.stamps: list[float | None] = []
        self.overflow = False

    def add(self, chunk: bytes, pid: int) -> None:
        room = self.limit - len(self.data)
        self.overflow = len(chunk) > room
        chunk = chunk[: max(room, 0)]
        lines = chunk.count(b"\n")
        if lines:
            stamp = tree_cpu(pid)
            self.stamps += [stamp] * lines
        self.data += chunk


def _exchange(
    proc: subprocess.Popen[bytes], source: bytes, out: _Output, limits: Limits, slot: _Slot
) -> bool:
    """Feed the source and read stdout until it closes, overflows or the wall-clock limit
    passes (then the whole process tree is killed). True when timed out."""
    assert proc.stdin is not None and proc.stdout is not None
    deadline = time.monotonic() + limits.wall_seconds
    stdin, stdout = proc.stdin.fileno(), proc.stdout.fileno()
    os.set_blocking(stdin, False)
    pending = memoryview(source)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            selector.register(stdin, selectors.EVENT_WRITE)
            while not out.overflow:
                left = deadline - time.monotonic()
                if left <= 0:
                    kill_tree(proc)
                    return True
                slot.watch(proc.pid)
                for key, _ in selector.select(min(left, _IDLE_POLL)):
                    if key.fd == stdin:
                        pending = _feed(stdin, pending)
                        if not pending:
                            selector.unregister(stdin)
                            proc.stdin.close()
                    elif chunk := os.read(stdout, 65536):
                        out.add(chunk, proc.pid)
                        if len(chunk) < _SMALL_READ:  # a drip: let it gather, so that the
                            time.sleep(_READ_PAUSE)  # parent's reads stay few
                    else:
                        return _wait_exit(proc, deadline, slot)
            kill_tree(proc)  # a flood: what it wrote within the limit is all it gets
            return False
    finally:
        _close(proc)


def _feed(fd: int, pending: memoryview) -> memoryview:
    """Write what the pipe takes; a reader that went away takes nothing more."""
    try:
        return pending[os.write(fd, pending[:65536]) :]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        return pending[:0]


def _close(proc: subprocess.Popen[bytes]) -> None:
    for stream in (proc.stdin, proc.stdout):
        if stream is not None and not stream.closed:
            stream.close()


def _wait_exit(proc: subprocess.Popen[bytes], deadline: float, slot: _Slot) -> bool:
    """Wait (without reaping) for the sandbox to exit; kill it at the deadline."""
    while True:
        slot.watch(proc.pid)
        try:
            done = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        if done is not None:
            return False
        if time.monotonic() >= deadline:
            kill_tree(proc)
            return True
        time.sleep(0.01)


# A sandbox writing a byte at a time would otherwise cost the parent a read (and a /proc
# sample) per byte: after a small read the parent waits 2 ms (a line's CPU stamp is then at
# most that much later, which only counts against the sandbox)
_SMALL_READ, _READ_PAUSE = 4096, 0.002


def run_many(
    sources: Sequence[str],
    limits: Limits | None = None,
    isolation: Isolation = "bwrap",
    workers: int | None = None,
) -> list[SandboxResult]:
    """Run each source in its own sandbox, `workers` computing at a time (default: one per
    CPU); a blocked one gives its place to the next (`_Slot`), up to WAITING_PER_WORKER times
    `workers` sandboxes alive at once."""
    if not sources:
        return []
    limits = limits or Limits()
    count = max(1, min(len(sources), workers or os.cpu_count() or 1))
    slots = threading.BoundedSemaphore(count)
    threads = min(len(sources), count * WAITING_PER_WORKER)

    def one(source: str) -> SandboxResult:
        with _Slot(slots) as slot:
            return _run(source, limits, isolation, slot)

    try:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="far-sandbox") as pool:
            return list(pool.map(one, sources))
    except RuntimeError as e:  # "can't start new thread": the host is out of tasks or memory
        if "thread" not in str(e):
            raise
        return [run_python(s, limits, isolation) for s in sources]  # here, one at a time


# A sandbox that has used no CPU, with no task runnable, for this long is blocked (sleeping,
# waiting on nothing): it gives its place in the pool to the next one, and the wall-clock
# limit still ends it. Sandboxes alive at once: at most this many per worker.
IDLE_SECONDS, _IDLE_POLL, WAITING_PER_WORKER = 1.0, 0.25, 4


class _Slot:
    """A place among `run_many`'s computing sandboxes, held from start until the sandbox
    exits or is found blocked (`watch`), whichever comes first; `_Slot(None)`: no pool."""

    def __init__(self, slots: threading.BoundedSemaphore | None) -> None:
        self._slots = slots
        self._held = False
        self._cpu: float | None = None
        self._since = self._checked = time.monotonic()

    def __enter__(self) -> _Slot:
        if self._slots is not None:
            self._slots.acquire()
            self._held = True
            self._since = time.monotonic()
        return self

    def __exit__(self, *_: object) -> None:
        self._give_back()

    def watch(self, pid: int) -> None:
        """Give the place back once `pid`'s tree has been blocked for IDLE_SECONDS."""
        now = time.monotonic()
        if not self._held or now - self._checked < _IDLE_POLL:  # a few /proc reads a second
            return
        self._checked, cpu = now, tree_cpu(pid)
        if cpu != self._cpu or any_runnable(pid):
            self._cpu, self._since = cpu, now
        elif now - self._since >= IDLE_SECONDS:
            self._give_back()

    def _give_back(self) -> None:
        if self._held and self._slots is not None:
            self._held = False
            self._slots.release()


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
