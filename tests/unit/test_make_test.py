"""`make test` runs the lint checks beside the tests (docs/contributing.md): the tests start
whatever lint finds, lint's output is printed after the tests', and either failing fails the
target. Real make and shells; the tools are stand-in scripts in a fake venv bin (the real
suite cannot run inside a test), each recording that it ran and exiting as told."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

TOOLS = ("ruff", "mypy", "lint-imports", "deptry", "mkdocs", "pytest")


def _make_test(tmp_path: Path, failing: set[str]) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in TOOLS:
        script = bin_dir / tool
        code = 1 if tool in failing else 0
        script.write_text(f'#!/bin/sh\necho "{tool} ran: $*"\nexit {code}\n')
        script.chmod(0o755)
    for name in ("Makefile", "requirements.lock", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    (bin_dir / ".installed").touch()  # newer than requirements.lock: no install
    env = dict(os.environ, FAR_CHROMIUM="/bin/true")  # the browser step finds one
    return subprocess.run(
        ["make", "--no-print-directory", "test", "VENV=venv", "BUILD_INFO=build-info.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize(
    ("failing", "fails"),
    [(set(), False), ({"ruff"}, True), ({"mypy"}, True), ({"pytest"}, True)],
    ids=["both-pass", "ruff-fails", "mypy-fails", "tests-fail"],
)
def test_lint_runs_beside_the_tests_and_either_failing_fails(
    tmp_path: Path, failing: set[str], fails: bool
) -> None:
    done = _make_test(tmp_path, failing)
    out = done.stdout
    assert (done.returncode != 0) is fails, out + done.stderr
    assert "pytest ran: -n 2 --dist loadgroup" in out, out  # the tests ran whatever lint found
    # lint's output comes after the tests', whole, under its heading
    assert out.index("pytest ran") < out.index("==== make lint-checks") < out.index("ruff ran")
    if "ruff" not in failing:
        assert "mypy ran: schemas stages pipeline flows" in out
    if failing & {"ruff", "mypy"}:
        assert "make test: lint FAILED" in done.stderr
