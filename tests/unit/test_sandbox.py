"""Hostile snippets through the sandbox: each fails (or passes honestly), nothing escapes,
the machine and this test process are unharmed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stages.rewards.sandbox import Limits, run_python

FAST = Limits(cpu_seconds=2, wall_seconds=5, memory_bytes=256 << 20, file_bytes=64 << 10)


def test_honest_code_runs() -> None:
    result = run_python("def add(a, b):\n    return a + b\nassert add(2, 3) == 5\nprint('ok')")
    assert result.ok and result.stdout == "ok\n"


def test_fork_bomb_is_refused() -> None:
    result = run_python("import os\nwhile True:\n    os.fork()", FAST)
    assert not result.ok and "refused os.fork" in result.stderr


def test_infinite_loop_is_stopped_by_cpu_limit() -> None:
    started = time.perf_counter()
    result = run_python("while True:\n    pass", FAST)
    assert not result.ok and time.perf_counter() - started < FAST.wall_seconds + 2


def test_sleeping_forever_is_stopped_by_the_wall_clock() -> None:
    result = run_python("import time\ntime.sleep(60)", Limits(wall_seconds=1.0))
    assert result.timed_out and not result.ok


def test_memory_bomb_fails_without_hurting_us() -> None:
    result = run_python("x = bytearray(8 << 30)\nprint(len(x))", FAST)
    assert not result.ok and "MemoryError" in result.stderr


def test_writes_outside_the_workdir_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    result = run_python(f"open({str(target)!r}, 'w').write('pwned')", FAST)
    assert not result.ok and not target.exists()
    inside = run_python("open('scratch.txt', 'w').write('fine')\nprint(open('scratch.txt').read())")
    assert inside.ok and inside.stdout == "fine\n"


def test_deleting_files_outside_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    for snippet in (
        f"import os\nos.remove({str(victim)!r})",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
    ):
        assert not run_python(snippet, FAST).ok
    assert victim.read_text() == "keep me"


def test_environment_secrets_are_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAR_TEST_SECRET", "hunter2")
    result = run_python("import os\nprint(os.environ.get('FAR_TEST_SECRET'))")
    assert result.stdout == "None\n"
    proc = run_python(f"print(open('/proc/{os.getpid()}/environ', 'rb').read())", FAST)
    assert not proc.ok and "hunter2" not in proc.stdout


def test_sockets_are_refused() -> None:
    result = run_python("import socket\ns = socket.create_connection(('127.0.0.1', 22), 1)", FAST)
    assert not result.ok and "socket" in result.stderr


def test_os_system_and_subprocess_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for snippet in (
        f"import os\nos.system('touch {marker}')",
        f"import subprocess\nsubprocess.run(['touch', {str(marker)!r}])",
    ):
        assert not run_python(snippet, FAST).ok
    assert not marker.exists()


def test_ctypes_is_refused() -> None:
    result = run_python("import ctypes\nctypes.CDLL(None).system(b'true')", FAST)
    assert not result.ok and "refused import ctypes" in result.stderr


def test_huge_output_is_capped() -> None:
    result = run_python("while True:\n    print('x' * 10000)", FAST)
    assert not result.ok and len(result.stdout) <= FAST.file_bytes


def test_sys_exit_zero_is_just_an_exit() -> None:
    assert run_python("import sys\nsys.exit(0)").ok
    assert not run_python("raise SystemExit(3)").ok
