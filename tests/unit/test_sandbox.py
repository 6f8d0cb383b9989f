"""The sandbox itself, at both isolation levels: what the untrusted process can and cannot do.

Attacks on the verdicts of the rewards live in tests/unit/test_redteam.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.lineage import LineageNode, render
from schemas.artifacts import CheckpointArtifact
from schemas.record import StageRecord
from stages import rewards
from stages.rewards import sandboxing
from stages.rewards.confinement import Limits
from stages.rewards.sandbox import missing_isolation, run_many, run_python

FAST = Limits(cpu_seconds=2, wall_seconds=8, memory_bytes=256 << 20, file_bytes=64 << 10)
LEVELS = ["bwrap", "process"]
UNSHARE_USER = (
    "import ctypes\n"
    "ctypes.CDLL(None, use_errno=True).unshare(0x10000000)\n"
    "raise SystemExit(ctypes.get_errno())"
)
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (make env installs it)"
)


@pytest.mark.parametrize("isolation", LEVELS)
def test_honest_code_runs(isolation: str) -> None:
    source = "def add(a, b):\n    return a + b\nassert add(2, 3) == 5\nprint('ok')"
    result = run_python(source, FAST, isolation)  # type: ignore[arg-type]
    assert result.ok and result.stdout == "ok\n"


@needs_bwrap
def test_bwrap_runs_as_nobody_in_its_own_namespaces(tmp_path: Path) -> None:
    (tmp_path / "visible.txt").write_text("host file")
    probe = (
        "import os, json\n"
        "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines()"
        " if ':\\t' in l)\n"
        "open('scratch', 'w').write('x')\n"
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups(),"
        " 'caps': status['CapEff'].strip(), 'nnp': status['NoNewPrivs'].strip(),"
        " 'seccomp': status['Seccomp'].strip(), 'root': sorted(os.listdir('/')),"
        " 'pids': sorted(p for p in os.listdir('/proc') if p.isdigit()), 'me': os.getpid(),"
        " 'cwd': os.getcwd(), 'env': sorted(os.environ),"
        f" 'host': os.path.exists({str(tmp_path)!r})}}))"
    )
    result = run_python(probe, FAST, "bwrap")
    seen = json.loads(result.stdout)
    # as root: a host uid of its own per sandbox (its task cap is its own); else 65534 in a
    # user namespace of its own
    assert seen["uid"] == 65534 or (1 << 30) <= seen["uid"] < (1 << 30) + (1 << 24)
    assert (seen["gid"], seen["groups"]) == (65534, [])
    assert seen["caps"] == "0000000000000000" and seen["nnp"] == "1" and seen["seccomp"] == "2"
    assert set(seen["root"]) <= {"usr", "bin", "sbin", "lib", "lib64", "lib32", "dev", "proc"} | {
        "sandbox",
        "opt",
        "root",
        "work",
        "home",
    }
    # itself and bubblewrap's init (PID 1, which dies with the grader: see the SIGKILL test)
    assert "etc" not in seen["root"] and seen["pids"] == ["1", "2"] and seen["me"] == 2
    assert seen["cwd"] == "/sandbox" and not seen["host"]
    assert set(seen["env"]) <= {"LANG", "HOME", "PATH", "PWD", "LC_CTYPE", "PYTHONHASHSEED"}


@needs_bwrap
def test_bwrap_system_files_are_read_only() -> None:
    target = os.path.join(os.path.realpath(os.path.dirname(os.__file__)), "far_probe.pth")
    result = run_python(f"open({target!r}, 'w').write('import os')", FAST, "bwrap")
    assert not result.ok and "Read-only file system" in result.stderr
    assert not os.path.exists(target)


@pytest.mark.parametrize("isolation", LEVELS)
@pytest.mark.parametrize(
    "snippet",
    [
        "import os\nos.fork()",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'true'])",
        "import subprocess\nsubprocess.run(['true'])",
        "import socket\nsocket.socket()",
        UNSHARE_USER,
    ],
)
def test_seccomp_refuses_processes_sockets_and_namespaces(isolation: str, snippet: str) -> None:
    result = run_python(snippet, FAST, isolation)  # type: ignore[arg-type]
    assert not result.ok


@pytest.mark.parametrize("isolation", LEVELS)
def test_threads_still_work(isolation: str) -> None:
    source = (
        "import threading\nt = threading.Thread(target=print, args=('t',))\nt.start()\nt.join()"
    )
    assert run_python(source, FAST, isolation).stdout == "t\n"  # type: ignore[arg-type]


@pytest.mark.parametrize("isolation", LEVELS)
def test_limits_stop_loops_sleepers_memory_and_floods(isolation: str) -> None:
    started = time.perf_counter()
    spin = replace(FAST, cpu_seconds=1)  # stopped by its CPU limit, long before the wall clock
    assert not run_python("while True:\n    pass", spin, isolation).ok  # type: ignore[arg-type]
    assert time.perf_counter() - started < spin.wall_seconds + 5
    asleep = run_python("import time\ntime.sleep(60)", Limits(wall_seconds=1.0), isolation)  # type: ignore[arg-type]
    assert asleep.timed_out and not asleep.ok
    memory = run_python("x = bytearray(8 << 30)", FAST, isolation)  # type: ignore[arg-type]
    assert not memory.ok and "MemoryError" in memory.stderr
    flood = run_python("while True:\n    print('x' * 10000)", FAST, isolation)  # type: ignore[arg-type]
    assert not flood.ok and len(flood.stdout) <= FAST.file_bytes


@pytest.mark.parametrize("isolation", LEVELS)
def test_environment_secrets_are_not_visible(
    isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAR_TEST_SECRET", "hunter2")
    result = run_python("import os\nprint(os.environ.get('FAR_TEST_SECRET'))", FAST, isolation)  # type: ignore[arg-type]
    assert result.stdout == "None\n"


def test_a_pool_keeps_order_and_one_slow_run_costs_only_itself() -> None:
    sources = ["print(1)", "import time\ntime.sleep(60)", "print(3)"]
    results = run_many(sources, Limits(wall_seconds=3.0), "bwrap", workers=2)
    assert [r.stdout for r in results] == ["1\n", "", "3\n"]
    assert [r.timed_out for r in results] == [False, True, False]


@needs_bwrap
def test_bwrap_is_available_here() -> None:
    assert missing_isolation("bwrap") is None


def test_a_machine_without_bubblewrap_is_refused_with_the_setting_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no bwrap on it
    with pytest.raises(rewards.IsolationUnavailable) as refused:
        rewards.require_isolation("bwrap")
    message = str(refused.value)
    assert "bubblewrap is not installed" in message
    assert "sandbox: {isolation: process}" in message
    rewards.require_isolation("process")  # the explicit weaker level is accepted


@pytest.mark.parametrize(("flag", "shown"), [(1.0, "bwrap"), (0.0, "process")])
def test_lineage_shows_the_isolation_level(flag: float, shown: str) -> None:
    record = StageRecord.model_construct(
        stage="grpo",
        run="r",
        directory="runs/r/grpo-abc",
        output=CheckpointArtifact.model_construct(uri="runs/r/grpo-abc/checkpoints"),
        stage_hash="c" * 64,
        sessions=[],
        seconds=1.0,
        flow_run_id=None,
        code=SimpleNamespace(far_version="0", git_commit=None, stage_version=1, packages={}),
        hardware=SimpleNamespace(
            platform="cpu", device_kind="cpu", device_count=1, process_count=1
        ),
        metrics={"sandbox_isolation_bwrap": flag, "sandbox_runs": 3.0},
    )
    text = render(LineageNode("grpo", "runs/r/grpo-abc/record.json", record))
    assert f"sandbox isolation: {shown}" in text


# A completion that blocks: no CPU, every timer signal ignored, asleep far past any limit
BLOCKED = (
    "import signal, time\n"
    "for s in (signal.SIGALRM, signal.SIGPROF, signal.SIGVTALRM, signal.SIGXCPU):\n"
    "    signal.signal(s, signal.SIG_IGN)\n"
    "time.sleep(600)\n"
    "def add(a, b):\n    return a + b"
)
ADD_TEST = ("assert add(1, 2) == 3",)
GRADER = f"""
from stages import rewards
from stages.rewards import Reference, SandboxStats
print("grading", flush=True)
rewards.code_pass_rate([{BLOCKED!r}], [Reference("", {ADD_TEST!r})], SandboxStats("bwrap", 1))
"""


def _sandboxed_under(ancestor: int) -> list[int]:
    """Live sandboxed interpreters (running the prelude, which loads seccomp, as their `-c`
    program; bubblewrap and the sandbox's init only pass it on) that descend from `ancestor`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            program = argv[argv.index(b"-c") + 1]
            if b"_load_seccomp" in program and ancestor in _ancestors(int(pid)):
                found.append(int(pid))
    return found


def _ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        pid = int(next(line.split()[1] for line in status if line.startswith("PPid:")))
        chain.append(pid)
    return chain


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _survivors(pids: list[int], grace_seconds: float = 10.0) -> list[int]:
    """`pids` still alive after a grace period (a killed namespace takes a moment to go)."""
    deadline = time.monotonic() + grace_seconds
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


@needs_bwrap
def test_a_sigkilled_grader_takes_its_sandbox_with_it() -> None:
    """Before this fix the sandboxed interpreter was PID 1 of its namespace under a uid of
    its own: bubblewrap's --die-with-parent killed bubblewrap, whose parent-death signal to the
    interpreter the kernel dropped (bubblewrap has no capabilities and another uid), so the
    blocked completion lived on under init. A real grader, SIGKILLed mid-grade."""
    grader = subprocess.Popen(
        [sys.executable, "-c", GRADER], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    seen: list[int] = []
    try:
        assert grader.stdout is not None and grader.stdout.readline() == b"grading\n"
        deadline = time.monotonic() + 30
        while not (seen := _sandboxed_under(grader.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen, "the grader started no sandbox"
        time.sleep(0.5)  # asleep in the completion
        grader.send_signal(signal.SIGKILL)
        grader.wait()
        survivors = _survivors(seen)
        assert survivors == [], f"sandboxed processes outlived their grader: {survivors}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            grader.kill()
        grader.wait()
        for pid in seen:  # what this test started, should it have survived
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@needs_bwrap
def test_blocked_completions_score_zero_side_by_side_and_leave_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On main each worker of the pool waited out a sleeping completion's whole wall-clock
    limit before starting the next sandbox: 4 of them turned 0.3 s of grading into 30 s. Now a
    blocked sandbox gives its place to the next: with one worker, the sleepers are alive side
    by side (counted from the host), each is killed at its limit (scored 0) and nothing is left
    behind; the honest completion behind them still scores 1."""
    quick = replace(sandboxing.CODE_LIMITS, wall_seconds=4.0)
    monkeypatch.setattr(sandboxing, "CODE_LIMITS", quick)
    honest = "def add(a, b):\n    return a + b"
    most, seen, stop = [0], set[int](), threading.Event()

    def count() -> None:
        while not stop.is_set():
            alive = _sandboxed_under(os.getpid())
            most[0], _ = max(most[0], len(alive)), seen.update(alive)
            time.sleep(0.05)

    watcher = threading.Thread(target=count)
    watcher.start()
    try:
        stats = rewards.SandboxStats("bwrap", workers=1)
        refs = [rewards.Reference("", ADD_TEST)] * 3
        scores = rewards.code_pass_rate([BLOCKED, BLOCKED, honest], refs, stats)
    finally:
        stop.set()
        watcher.join()
    assert scores == [0.0, 0.0, 1.0] and (stats.runs, stats.failures) == (3, 2)
    assert most[0] >= 2, "one sleeping sandbox at a time: the pool waited on each"
    # the two sleepers live for seconds, so the watcher sees both; the honest one may come
    # and go between two looks on a loaded machine
    assert len(seen) >= 2 and _survivors(sorted(seen)) == []
