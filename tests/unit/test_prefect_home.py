"""A PREFECT_HOME that Prefect cannot create (a red-team finding): `far run` says so in one line,
naming the path and the fix, exit 2, before its temporary Prefect server starts. It was
reported as a server start timeout.

Runs the real CLI in a child process, with no Prefect API configured (so `far` would start
its own server) and a short start-up limit, so the old behaviour fails fast too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, smoke_data


def _far_run(tmp_path: Path, home: Path) -> subprocess.CompletedProcess[str]:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**smoke_data(), "storage_root": str(tmp_path / "runs")}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path),
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "15",
        "JAX_PLATFORMS": "cpu",
    }
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(recipe)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )


@pytest.mark.parametrize("case", ["missing parent", "a file"])
def test_unusable_prefect_home_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    if case == "a file":
        home = tmp_path / "prefect"
        home.write_text("not a directory")
        said = f"PREFECT_HOME {home} is not a directory"
    else:
        home = tmp_path / "no" / "such" / "prefect"
        said = f"PREFECT_HOME {home}: its parent {home.parent} does not exist"
    done = _far_run(tmp_path, home)
    far_lines = [line for line in done.stderr.splitlines() if line.startswith("far: ")]
    assert done.returncode == 2, done.stderr
    assert len(far_lines) == 1 and far_lines[0].startswith(f"far: {said}"), done.stderr
    assert "Timed out" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran
