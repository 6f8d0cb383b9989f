"""The sandbox seen from outside, where it cannot reach: its process tree, CPU time and task
states read from /proc, its total CPU time from wait4, and the SIGKILL of the whole tree.
Callers judge a sandbox on these numbers, never on what it says about itself."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process tree, sandboxed process first (with bwrap, the namespace dies with
    its init), and bwrap's process group."""
    for pid in reversed(tree(proc.pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def tree(pid: int) -> list[int]:
    """`pid` and its descendants, parents before children."""
    order, queue = [], [pid]
    while queue:
        current = queue.pop()
        order.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children") as f:
                queue += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return order


def reap(proc: subprocess.Popen[bytes]) -> float:
    """Reap the sandbox; its total CPU seconds (with every descendant it reaped) from rusage."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float | None:
    """CPU seconds of `pid` and its descendants (all threads, and the children they reaped), read
    from /proc leaves first: a process reaped meanwhile is then counted in its parent's
    children's time, never lost. None when `pid` has exited."""
    total = 0
    for current in reversed(tree(pid)):
        try:
            with open(f"/proc/{current}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if current == pid and fields[0] in "ZX":
            return None
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / _TICK


def any_runnable(pid: int) -> bool:
    """True when a task (thread) of `pid` or a descendant is running, runnable or waiting
    uninterruptibly in the kernel (disk, page faults): it is not blocked of its own accord."""
    for current in tree(pid):
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state in ("R", "D"):
                return True
    return False
