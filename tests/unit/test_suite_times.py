"""Every test session prints its wall and CPU time and appends them to a JSON file
(tests/conftest.py), so that a change to the suite can be compared with the runs before it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def run_session(times: Path) -> str:
    """A pytest session of its own on a small test file: one that imports no model code (the
    rows are written by tests/conftest.py whatever the tests import), 2 CPU s where a file
    importing Tunix took 7.5."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/unit/test_demo_recipes.py",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=REPO,
        env={**os.environ, "FAR_SUITE_TIMES": str(times)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_each_session_prints_and_appends_its_wall_and_cpu_time(tmp_path: Path) -> None:
    times = tmp_path / "nested" / "suite-times.json"
    first = run_session(times)
    run_session(times)

    rows = json.loads(times.read_text())
    assert len(rows) == 2, rows
    row = rows[0]
    assert row["passed"] > 0 and row["failed"] == 0 and row["exit_status"] == 0
    assert row["args"] == ["tests/unit/test_demo_recipes.py", "-q", "-p", "no:cacheprovider"]
    assert len(row["git_commit"]) == 40
    assert row["wall_s"] > 0 and row["cpu_s"] > 0
    assert abs(row["cpu_s"] - row["user_s"] - row["sys_s"]) <= 0.11  # each rounded to 0.1 s
    assert f"suite: {row['wall_s']} s wall, {row['cpu_s']} s CPU" in first
