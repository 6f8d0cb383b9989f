"""docs/your-own-task.md's walkthrough, run as the page writes it: a JSONL file with its own
column names and a ten-line reward module (docs/examples/own-task/) through `far validate`,
`far run` (data-prep, SFT, GRPO on the user's reward, evaluation), `far export` and
transformers loading the export and answering.

The page's console block is read from the page itself, so a command changed there is the
command tested. Two things differ from a user's shell, both said here: the example folder is a
copy under the test's tmp_path (the run writes beside the recipe), and the export goes to the
test's tmp_path instead of /tmp/own-task-hf. `far` and `python` are the project's venv (the
page says to activate it), talking to the session's Prefect server.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, prefect_env

pytestmark = pytest.mark.slow
PAGE = REPO / "docs" / "your-own-task.md"
SECTION = "## From a JSONL file to an exported model"
EXPORT = "/tmp/own-task-hf"


def page_commands() -> list[str]:
    """The `$ ` lines of the first console block in the page's walkthrough section."""
    section = PAGE.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```console\n(.*?)```", section, re.DOTALL)
    assert block is not None, f"{PAGE}: no console block under {SECTION!r}"
    return [line[2:] for line in block[1].splitlines() if line.startswith("$ ")]


def test_the_page_commands_are_the_walkthrough() -> None:
    commands = page_commands()
    assert [c.split()[0:2] for c in commands] == [
        ["cd", "docs/examples/own-task"],
        ["far", "validate"],
        ["far", "run"],
        ["far", "export"],
        ["python", "load.py"],
    ]
    assert sum(EXPORT in c for c in commands) == 2


def test_the_own_task_page_runs_as_written(tmp_path: Path, prefect_api: str) -> None:
    shutil.copytree(
        REPO / "docs" / "examples" / "own-task",
        tmp_path / "docs" / "examples" / "own-task",
        ignore=shutil.ignore_patterns("runs", "__pycache__"),
    )
    export = tmp_path / "export"
    script = "\n".join(["set -euo pipefail", *page_commands()]).replace(EXPORT, str(export))
    env = prefect_env(tmp_path / "prefect-home", prefect_api)
    env.update(PATH=f"{BIN}:{env['PATH']}", PYTHONPATH="", FAR_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-5000:]
    assert "recipe recipe.yaml: valid" in said  # far validate, before any compute
    assert "plain_number" in said  # the user's reward scored in the evaluation table
    assert (export / "model.safetensors").is_file() and (export / "README.md").is_file()
    answer = done.stdout.strip().splitlines()[-1]  # load.py's decoded completion
    assert "<answer>" in answer and "</answer>" in answer, said[-3000:]
