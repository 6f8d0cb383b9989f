"""The one training tail (stages/modeling/training_tail.py) with a real Tunix PeftTrainer and
real Orbax checkpoints on a one-layer network: a stopped session publishes its checkpoint and
says SessionExpired, the next session resumes at the saved step and commits weights equal to
an uninterrupted session's, bit for bit; a session with no time for a step is NoProgress.
The stages' own resume tests (tests/integration) run the same tail on the tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from tunix.sft import metrics_logger, peft_trainer

from schemas.recipe import MeshSpec, ModelSpec
from stages.core.datasets import in_memory_stream
from stages.core.runner import NoProgress, RunContext, SessionExpired
from stages.core.sessions import StopFlag
from stages.modeling import models
from stages.modeling.training_tail import (
    TrainingTail,
    earlier_curves,
    joined_curves,
    keep_curves,
    replayed_batches,
    session_dirs,
)

MAX_STEPS = 4
MODEL = ModelSpec(source="gguf", preset="gemma3_270m", tokenizer="sentencepiece")  # a label


class StopAfter(StopFlag):
    """A stop request that arrives after `checks` looks at the flag (deterministic)."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.left = checks

    def is_set(self) -> bool:
        self.left -= 1
        if self.left < 0 and not super().is_set():
            self.request("stop requested by the test")
        return super().is_set()


def squared_error(model: nnx.Module, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)  # type: ignore[operator]


def records() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 2)).astype(np.float32)
    return [{"x": row, "y": row[::-1] * 2.0} for row in x]


def tail_in(directory: Path) -> TrainingTail:
    """A fresh trainer on `directory` (restored from its checkpoints, if any) and its tail."""
    dirs = session_dirs(str(directory))
    config = peft_trainer.TrainingConfig(
        eval_every_n_steps=10**9,
        max_steps=MAX_STEPS,
        checkpoint_root_directory=dirs.local_ckpt,
        checkpointing_options=ocp.CheckpointManagerOptions(save_interval_steps=1),
        metrics_logging_options=metrics_logger.MetricsLoggerOptions(log_dir=dirs.local_logs),
    )
    network = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    trainer = peft_trainer.PeftTrainer(network, optax.sgd(0.1), config)
    trainer = trainer.with_loss_fn(squared_error)
    return TrainingTail.for_trainer("toy", trainer, dirs, MAX_STEPS, save_margin_s=0.0)


def session(directory: Path, stop: StopFlag | None = None) -> tuple[TrainingTail, Any]:
    tail = tail_in(directory)
    ctx = RunContext(root=str(directory.parent), run="run", stop=stop)
    stream = in_memory_stream(replayed_batches(records(), 4, seed=3))
    mesh = models.build_mesh(MeshSpec())
    curves = lambda: tail.curves("loss")  # noqa: E731
    return tail, tail.run(stream, ctx, mesh, MODEL, "toy-tokenizer", None, curves=curves)


def weights(tail: TrainingTail) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(tail.trainer.model, nnx.Param))]


def test_a_stopped_session_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    whole, artifact = session(tmp_path / "whole")
    assert artifact.step == MAX_STEPS and artifact.lora is None
    assert len(whole.curves("loss")["loss"]) == MAX_STEPS

    with pytest.raises(SessionExpired, match="toy stopped at step 2 of 4"):
        session(tmp_path / "split", StopAfter(2))  # batches 0 and 1, then the stop
    assert (tmp_path / "split" / "checkpoints" / "2").is_dir()  # published when stopping
    resumed, again = session(tmp_path / "split")
    assert resumed.start_step == 2
    assert len(resumed.curves("loss")["loss"]) == MAX_STEPS - 2  # this session's steps only
    assert again.step == MAX_STEPS
    for a, b in zip(weights(whole), weights(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    # the record's history: the stopped session's kept curves, then this session's, equal to
    # the uninterrupted session's losses step by step
    history, first_step = resumed.whole_history(resumed.curves("loss"))
    assert first_step == 0
    assert history == whole.whole_history(whole.curves("loss"))[0] == whole.curves("loss")


def test_the_history_chains_the_kept_curves_that_lead_to_the_resumed_step(
    tmp_path: Path,
) -> None:
    """Steps 0-3 and 3-5 kept; 3-4 too, from a session whose checkpoint was never published
    (the resume came from 3 again): the chain to step 5 is 0-3, 3-5. Without 0-3 (a session
    killed before it could keep its curves) the history begins at step 3, and says so."""
    uri = str(tmp_path / "history")
    keep_curves(uri, 0, 3, {"loss": [3.0, 2.0, 1.0], "lr": [0.1] * 3})
    keep_curves(uri, 3, 4, {"loss": [9.0], "lr": [0.1]})
    keep_curves(uri, 3, 5, {"loss": [0.9, 0.8], "lr": [0.1] * 2})
    parts, first_step = earlier_curves(uri, 5)
    assert first_step == 0
    assert joined_curves([*parts, {"loss": [0.7], "lr": [0.1]}]) == {
        "loss": [3.0, 2.0, 1.0, 0.9, 0.8, 0.7],
        "lr": [0.1] * 6,
    }
    assert earlier_curves(uri, 0) == ([], 0)  # a first session
    (tmp_path / "history" / "00000000-00000003.json").unlink()
    parts, first_step = earlier_curves(uri, 5)
    assert first_step == 3 and parts == [{"loss": [0.9, 0.8], "lr": [0.1] * 2}]
    assert earlier_curves(uri, 7) == ([], 7)  # nothing kept ends where the session began


def test_a_session_with_no_time_for_a_step_is_no_progress(tmp_path: Path) -> None:
    with pytest.raises(SessionExpired, match="toy stopped at step 1 of 4"):
        session(tmp_path / "first", StopAfter(1))  # one step, then stopped
    with pytest.raises(NoProgress, match="toy stopped at step 1 of 4 without taking a step"):
        session(tmp_path / "first", StopAfter(0))
