"""docs/your-own-task.md's two walkthroughs, run as the page writes them.

"From a JSONL file to an exported model": a JSONL file with its own column names and a
ten-line reward module (docs/examples/own-task/) through `far validate`, `far run` (data-prep,
SFT, GRPO on the user's reward, evaluation), `far export` and transformers loading the export
and answering. "Your own checkpoint": a Qwen 3 checkpoint directory saved by transformers
(config.json, safetensors, tokenizer.json, chat template), answer-only rows and a reward in
TRL's batch form (docs/examples/own-checkpoint/) through the same commands with
`far export --adapter`, and peft loading the adapter on its base and answering.

The page's console blocks are read from the page itself, so a command changed there is the
command tested. What differs from a user's shell, said here: each example folder is a copy
under the test's tmp_path (the run writes beside the recipe); the exports go to the test's
tmp_path instead of /tmp; and the checkpoint directory the recipe names (the page says to
download one there) is a tiny random Qwen 3 the test writes (tests/hf_checkpoints.py). `far`
and `python` are the project's venv (the page says to activate it), talking to the session's
Prefect server.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, REPO, prefect_env
from tests.hf_checkpoints import write_checkpoint

pytestmark = pytest.mark.slow
PAGE = REPO / "docs" / "your-own-task.md"
SECTION = "## From a JSONL file to an exported model"
EXPORT = "/tmp/own-task-hf"
CHECKPOINT_SECTION = "## Your own checkpoint"
ADAPTER = "/tmp/own-checkpoint-adapter"


def page_commands(section: str = SECTION) -> list[str]:
    """The `$ ` lines of the first console block in one of the page's sections."""
    text = PAGE.read_text().split(section, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```console\n(.*?)```", text, re.DOTALL)
    assert block is not None, f"{PAGE}: no console block under {section!r}"
    return [line[2:] for line in block[1].splitlines() if line.startswith("$ ")]


def run_page(commands: list[str], cwd: Path, prefect_api: str) -> subprocess.CompletedProcess[str]:
    """The commands as one bash script (stopping at the first failure), in the project's venv."""
    env = prefect_env(cwd / "prefect-home", prefect_api)
    env.update(PATH=f"{BIN}:{env['PATH']}", PYTHONPATH="", FAR_CACHE_DIR=str(cwd / "cache"))
    return subprocess.run(
        ["bash", "-c", "\n".join(["set -euo pipefail", *commands])],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )


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
    commands = [c.replace(EXPORT, str(export)) for c in page_commands()]
    done = run_page(commands, tmp_path, prefect_api)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-5000:]
    assert "recipe recipe.yaml: valid" in said  # far validate, before any compute
    assert "plain_number" in said  # the user's reward scored in the evaluation table
    assert (export / "model.safetensors").is_file() and (export / "README.md").is_file()
    answer = done.stdout.strip().splitlines()[-1]  # load.py's decoded completion
    assert "<answer>" in answer and "</answer>" in answer, said[-3000:]


def test_the_checkpoint_commands_are_the_walkthrough() -> None:
    commands = page_commands(CHECKPOINT_SECTION)
    assert [c.split()[0:2] for c in commands] == [
        ["cd", "docs/examples/own-checkpoint"],
        ["far", "validate"],
        ["far", "run"],
        ["far", "export"],
        ["python", "load_adapter.py"],
    ]
    assert "--adapter" in commands[3].split()
    assert sum(ADAPTER in c for c in commands) == 2


def test_your_own_checkpoint_runs_as_written(tmp_path: Path, prefect_api: str) -> None:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    example = tmp_path / "docs" / "examples" / "own-checkpoint"
    shutil.copytree(
        REPO / "docs" / "examples" / "own-checkpoint",
        example,
        ignore=shutil.ignore_patterns("runs", "__pycache__", "my-qwen3"),
    )
    model = yaml.safe_load((example / "recipe.yaml").read_text())["model"]
    assert (model["family"], model["source"]) == ("qwen3", "safetensors")
    write_checkpoint("qwen3", example / model["uri"])  # where the page says to put yours
    adapter = tmp_path / "adapter"
    commands = [c.replace(ADAPTER, str(adapter)) for c in page_commands(CHECKPOINT_SECTION)]
    done = run_page(commands, tmp_path, prefect_api)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-5000:]
    assert "recipe recipe.yaml: valid" in said  # far validate, before any compute
    assert "reversed_word (mean): grpo" in said  # the batch reward, in the evaluation summary
    assert "missing adapter keys" not in said  # peft found a tensor for every LoRA module
    assert done.stdout.strip(), said[-3000:]  # load_adapter.py's decoded completion
    # the adapter is live: on its base, peft computes other logits than the base alone
    ids = torch.tensor([list(range(3, 40))])
    base = AutoModelForCausalLM.from_pretrained(adapter / "base", dtype=torch.float32).eval()
    with torch.no_grad():
        plain = base(ids).logits
        tuned = peft.PeftModel.from_pretrained(base, str(adapter))(ids).logits
    assert (tuned - plain).abs().max() > 1e-6
