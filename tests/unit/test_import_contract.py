"""The import contract in pyproject.toml holds, and a deliberate violation fails the lint.

`make lint` runs `lint-imports`; these tests run it on a copy of the code with one violation
planted, so a contract that silently stopped checking would show here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy_code(tmp_path: Path) -> Path:
    for package in ("schemas", "stages", "pipeline", "flows"):
        shutil.copytree(REPO / package, tmp_path / package)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_code_keeps_the_contract(tmp_path: Path) -> None:
    result = _lint(_copy_code(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("stages/grpo/training.py", "from stages import sft", "A stage never imports another"),
        ("stages/evaluate/reports.py", "import prefect", "Only flows/ imports Prefect"),
        ("stages/core/storage.py", "from stages import sft", "never import a stage"),
        ("schemas/base.py", "import stages.core.storage", "imports nothing of FAR"),
        ("stages/sft.py", "import flows.far_flow", "Layers: flows"),
    ],
)
def test_a_planted_violation_fails_the_lint(
    tmp_path: Path, module: str, planted: str, contract: str
) -> None:
    root = _copy_code(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n{planted}  # planted by the test\n")
    result = _lint(root)
    assert result.returncode != 0
    assert contract in result.stdout and "BROKEN" in result.stdout
