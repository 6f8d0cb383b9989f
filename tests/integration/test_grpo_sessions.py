"""GRPO across sessions on the tiny model: a stop request saves and stops, the next session
resumes at the saved step (and the next prompt batch) and finishes; gspo-token loss runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from schemas.record import StageRecord
from stages import data_prep, grpo, sft
from stages.core import storage
from stages.core.runner import RunContext, SessionExpired
from stages.core.sessions import StopFlag
from tests.conftest import recipe_with

pytestmark = pytest.mark.slow


def _stop_when(path_glob: str, root: Path, flag: StopFlag) -> threading.Thread:
    def watch() -> None:
        deadline = time.time() + 300
        while time.time() < deadline and not flag.is_set():
            if list(root.glob(path_glob)):
                flag.request("received signal SIGTERM")
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_grpo_stops_on_request_and_resumes_at_the_saved_step(tmp_path: Path) -> None:
    recipe = recipe_with(
        str(tmp_path), sft={"max_steps": 20}, grpo={"max_steps": 6, "checkpoint_every_steps": 1}
    )
    ctx = RunContext(str(tmp_path), "g")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    policy = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output
    flag = StopFlag()
    stopping = RunContext(str(tmp_path), "g", stop=flag)
    watcher = _stop_when("g/grpo-*/checkpoints/actor/2", tmp_path, flag)
    with pytest.raises(SessionExpired, match=r"GRPO stopped at step (\d+) of 6"):
        grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, stopping)
    watcher.join()
    saved = max(
        int(p.name) for p in tmp_path.glob("g/grpo-*/checkpoints/actor/*") if p.name.isdigit()
    )
    assert 2 <= saved < 6
    outcome = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)
    record = StageRecord.model_validate(storage.read_json(outcome.record_uri))
    assert record.metrics["resumed_from_step"] == saved
    assert outcome.output.step == 6
    assert any(f.startswith("6/") for f in storage.list_files(outcome.output.uri))
    # equality with an uninterrupted run (bitwise): test_grpo_full.py's kill -9 test


def test_gspo_token_loss_runs(tmp_path: Path) -> None:
    recipe = recipe_with(
        str(tmp_path),
        sft={"max_steps": 4},
        grpo={"max_steps": 1, "algorithm": "gspo-token", "num_iterations": 2},
    )
    ctx = RunContext(str(tmp_path), "gs")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    policy = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output
    outcome = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)
    assert outcome.output.step == 1
