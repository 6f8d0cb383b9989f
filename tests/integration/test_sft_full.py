"""The SFT stage in full on the tiny model: learning, checkpoint sizes, compilations,
TensorBoard, full weights, deadline and SIGTERM stops, and kill -9 resume (bitwise)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from schemas.artifacts import CheckpointArtifact
from schemas.recipe import MeshSpec
from schemas.record import StageRecord
from stages import sft
from stages.core import storage
from stages.core.runner import RunContext, SessionExpired
from stages.core.sessions import StopFlag
from stages.data_prep import build as data_prep
from stages.modeling import models
from tests.conftest import REPO, recipe_with
from tests.integration._sft_child import EXIT_SESSION_ENDED

pytestmark = pytest.mark.slow


def run_child(root: Path, max_steps: int, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration._sft_child", str(root), str(max_steps), *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def record_of(root: Path) -> StageRecord:
    records = list(root.glob("child/sft-*/stage.json"))
    assert len(records) == 1, records
    return StageRecord.model_validate(storage.read_json(str(records[0])))


def lora_leaves(checkpoint: CheckpointArtifact) -> list[np.ndarray]:
    mesh = models.build_mesh(MeshSpec())
    base = models.build_base_model(checkpoint.model, mesh, "unused")
    policy = models.restore_policy(checkpoint, base, mesh)
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(policy, nnx.LoRAParam))]


def test_sft_learns_and_records_its_metrics(tmp_path: Path) -> None:
    recipe = recipe_with(
        str(tmp_path), sft={"max_steps": 60, "warmup_steps": 10, "lr_schedule": "warmup_cosine"}
    )
    ctx = RunContext(str(tmp_path), "r")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    outcome = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx)
    metrics = StageRecord.model_validate(storage.read_json(outcome.record_uri)).metrics
    # 6.29 (= ln 512, uniform) -> ~4.5 (after 60 steps as after 150): the format tokens are
    # learned; the arithmetic is not
    assert metrics["final_loss"] < 0.8 * metrics["first_loss"]
    assert metrics["train_step_compilations"] == 1
    assert metrics["tokens_per_second"] > 0 and 0 < metrics["useful_token_fraction"] <= 1
    # the cosine ends at 10% of the peak learning rate
    assert metrics["final_learning_rate"] == pytest.approx(0.1 * recipe.sft.learning_rate, rel=0.05)
    # both sizes are recorded; adapters + their Adam state stay below the bare full weights
    assert metrics["checkpoint_bytes"] < metrics["full_params_bytes"]
    events = list(Path(outcome.output.uri).parent.glob("tensorboard/**/events.out.tfevents*"))
    assert events, "no TensorBoard event files"


def test_full_weights_sft_trains_and_restores(tmp_path: Path) -> None:
    recipe = recipe_with(
        str(tmp_path), sft={"max_steps": 4, "lora": None, "checkpoint_every_steps": 2}
    )
    ctx = RunContext(str(tmp_path), "r")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    checkpoint = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output
    assert checkpoint.lora is None
    lora_recipe = recipe_with(str(tmp_path), sft={"max_steps": 4, "checkpoint_every_steps": 2})
    lora_run = RunContext(str(tmp_path), "r-lora")  # another SFT config: another run
    lora = sft.train(dataset, lora_recipe.sft, recipe.model, recipe.mesh, lora_run).output
    # the same tiny model, same steps: LoRA r8 stores a fifth of the full checkpoint or less
    # (measured 0.86 MB vs 4.4 MB; on Gemma 3 270M the ratio is far smaller, see README)
    assert lora.size_bytes < 0.25 * checkpoint.size_bytes
    mesh = models.build_mesh(recipe.mesh)
    fresh = models.build_base_model(recipe.model, mesh, "unused")
    before = [np.asarray(x) for x in jax.tree.leaves(nnx.state(fresh, nnx.Param))]
    restored = models.restore_policy(checkpoint, fresh, mesh)
    after = [np.asarray(x) for x in jax.tree.leaves(nnx.state(restored, nnx.Param))]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


KILL_STEPS = 30  # checkpoints every 5: killed after 10, torn at 30 (the final save), 25 kept


def test_kill_9_twice_once_mid_checkpoint_write_equals_uninterrupted(tmp_path: Path) -> None:
    straight = run_child(tmp_path / "straight", KILL_STEPS)
    assert straight.wait(timeout=300) == 0, straight.stdout.read()  # type: ignore[union-attr]
    # paced (a sleep before every batch): the steps after checkpoint 10 outlast the polling
    victim = run_child(tmp_path / "killed", KILL_STEPS, "--pace", "0.2")
    checkpoints = tmp_path / "killed" / "child"
    deadline = time.time() + 240
    while not list(checkpoints.glob("sft-*/checkpoints/10")):
        assert victim.poll() is None, "finished before it could be killed"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not list(checkpoints.glob("sft-*/stage.json"))  # not committed
    # the second session dies in the middle of writing checkpoint 30: a torn save
    torn = run_child(tmp_path / "killed", KILL_STEPS, "--die-in-save", "30")
    output = torn.communicate(timeout=300)[0]
    assert torn.returncode == -signal.SIGKILL, output
    assert "KILLING MYSELF while saving step 30" in output
    saved = [p.name for p in checkpoints.glob("sft-*/checkpoints/*")]
    assert "25" in saved and "30" not in saved
    assert any(name.startswith("30.orbax-checkpoint-tmp") for name in saved), saved
    resumed = run_child(tmp_path / "killed", KILL_STEPS)
    output = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, output
    record = record_of(tmp_path / "killed")
    assert record.metrics["resumed_from_step"] == 25  # the torn step 30 was not used
    assert record.metrics["train_step_compilations"] == 1  # one compile in the resumed run too
    expected = lora_leaves(record_of(tmp_path / "straight").output)  # type: ignore[arg-type]
    got = lora_leaves(record.output)  # type: ignore[arg-type]
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


# The deadline test's SFT: its first session is paced (a sleep before every batch) so that
# DEADLINE_STEPS steps take longer than its DEADLINE_S however fast the machine or warm the
# compile cache: the deadline falls mid-training after a few dozen steps of compute
DEADLINE_S, DEADLINE_STEPS, DEADLINE_PACE_S = 25, 60, 0.5


def test_deadline_stops_with_a_checkpoint_and_the_next_session_finishes(tmp_path: Path) -> None:
    # No periodic checkpoint before the last step: the only one the first session leaves is
    # the save its deadline stop made, and the second session (the rest of the steps, not
    # paced) writes one checkpoint, not one every 5 steps
    cadence = ("--checkpoint-every", str(DEADLINE_STEPS))
    assert DEADLINE_STEPS * DEADLINE_PACE_S > DEADLINE_S  # the first session cannot finish
    first = run_child(
        tmp_path / "sessions",
        DEADLINE_STEPS,
        str(DEADLINE_S),
        *cadence,
        "--pace",
        str(DEADLINE_PACE_S),
    )
    output = first.communicate(timeout=300)[0]
    assert first.returncode == EXIT_SESSION_ENDED, output
    assert "SESSION ENDED" in output
    saved = sorted(
        int(p.name)
        for p in (tmp_path / "sessions").glob("child/sft-*/checkpoints/*")
        if p.name.isdigit()
    )
    assert len(saved) == 1 and 0 < saved[0] < DEADLINE_STEPS, saved
    second = run_child(tmp_path / "sessions", DEADLINE_STEPS, *cadence)
    assert second.wait(timeout=600) == 0
    record = record_of(tmp_path / "sessions")
    assert record.metrics["resumed_from_step"] == saved[0]
    # the record's history holds both sessions' steps: the stopped one kept its curves
    assert record.metrics["history_from_step"] == 0
    assert len(record.history["loss"]) == len(record.history["learning_rate"]) == DEADLINE_STEPS
    assert record.metrics["first_loss"] == record.history["loss"][0]  # step 1's, not the resume's


def stop_requested_after(batches: int, flag: StopFlag) -> Callable[[Any], Iterator[Any]]:
    """SFT's batch stream; once it has handed out `batches` batches, another thread requests
    the stop (as a signal handler does): the stop lands mid-training after a few steps,
    however long the stage took to start."""
    stream = sft.in_memory_stream

    def stopping(dataset: Any) -> Iterator[Any]:
        for handed_out, item in enumerate(stream(dataset)):
            if handed_out == batches:
                threading.Thread(target=flag.request, args=("received signal SIGTERM",)).start()
            yield item

    return stopping


def test_stop_flag_saves_and_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = recipe_with(str(tmp_path), sft={"max_steps": 2000, "checkpoint_every_steps": 1000})
    flag = StopFlag()
    ctx = RunContext(str(tmp_path), "r", stop=flag)
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    monkeypatch.setattr(sft, "in_memory_stream", stop_requested_after(3, flag))
    with pytest.raises(SessionExpired, match=r"SFT stopped at step \d+ of 2000"):
        sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx)
    steps = [int(p.name) for p in tmp_path.glob("r/sft-*/checkpoints/*") if p.name.isdigit()]
    assert steps and max(steps) < 1000  # saved where it stopped: no periodic save before 1000
    with pytest.raises(SessionExpired, match="SIGTERM before stage sft"):
        sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx)


def killed_before_the_record(root: Path, max_steps: int) -> Path:
    """A session SIGKILLed after SFT saved its final checkpoint, before the stage's record."""
    victim = run_child(root, max_steps, "--die-before-record")
    output = victim.communicate(timeout=300)[0]
    assert victim.returncode == -signal.SIGKILL, output
    assert "KILLING MYSELF before the SFT record" in output
    [stage] = list(root.glob("child/sft-*"))
    assert not (stage / "stage.json").exists()
    assert str(max_steps) in os.listdir(stage / "checkpoints")
    return stage


def test_a_session_killed_between_the_final_checkpoint_and_the_record_commits_next_time(
    tmp_path: Path,
) -> None:
    """The next session restores the final checkpoint, takes no step and commits it (it failed
    with KeyError('') from Tunix's metrics logger, which holds no loss of this session)."""
    stage = killed_before_the_record(tmp_path, 10)
    again = run_child(tmp_path, 10)
    output = again.communicate(timeout=300)[0]
    assert again.returncode == 0, output
    assert "KeyError" not in output and f"RECORD {stage}/stage.json" in output
    record = record_of(tmp_path)
    assert record.metrics["resumed_from_step"] == 10 and record.metrics["steps_this_session"] == 0
    assert record.history["loss"] == []  # no step this session: no curve, not a crash


def test_a_deleted_checkpoint_file_falls_back_to_the_previous_step_then_fails_in_one_line(
    tmp_path: Path,
) -> None:
    """A file deleted from the latest step: the next session says so in one line (FAR's; what
    Orbax's failed read leaves goes to the log at DEBUG, not the console), sets the step aside
    and resumes from the step before it."""
    stage = killed_before_the_record(tmp_path, 10)
    # the largest file holds array data (Orbax restores without its small metadata files)
    files = [p for p in (stage / "checkpoints" / "10").rglob("*") if p.is_file()]
    victim = max(files, key=lambda p: p.stat().st_size)
    victim.unlink()
    resumed = run_child(tmp_path, 10)
    output = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, output
    said = [line for line in output.splitlines() if "cannot be restored" in line]
    assert len(said) == 1 and "resuming from step 5" in said[0], output
    assert "Traceback" not in output and "Exception ignored" not in output, output
    assert record_of(tmp_path).metrics["resumed_from_step"] == 5
    assert (stage / "checkpoints.damaged" / "10").is_dir()
