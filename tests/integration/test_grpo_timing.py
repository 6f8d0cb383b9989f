"""Per-phase GRPO timing on the tiny model: every phase's seconds per step land in the
record's history and in TensorBoard; with the backward in micro-batches, each step still
rolls out all of its prompts in one call; `draw: inverse_cdf` reaches the rollout's sampler."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from schemas.record import StageRecord
from stages import sft
from stages.core import storage
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.grpo import training as grpo
from stages.modeling import tunix_compat
from tests.conftest import recipe_with
from tests.tensorboard_events import scalar_tags
from tests.unit.test_sampling import spy_on_inverse_cdf

pytestmark = pytest.mark.slow
STEPS = 2
TIMED = (
    "rollout",
    "rollout_prefill",
    "rollout_decode",
    "reference_logps",
    "old_logps",
    "rewards",
    "actor_update",
    "checkpoint_save",
)


def test_each_phase_is_timed_per_step_and_rolled_out_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = recipe_with(
        str(tmp_path),
        sft={"max_steps": 4},
        grpo={
            "max_steps": STEPS,
            "num_iterations": 2,
            "checkpoint_every_steps": 1,
            "train_micro_batch_size": 1,  # two backward passes a step
            "draw": "inverse_cdf",
        },
    )
    rows: list[int] = []  # prompts (times num_generations) per sampled rollout call
    real_generate = tunix_compat.SeededRollout.generate

    def counting(self: tunix_compat.SeededRollout, prompts: list[str], *args: object, **kw: object):  # type: ignore[no-untyped-def]
        rows.append(len(prompts))
        return real_generate(self, prompts, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(tunix_compat.SeededRollout, "generate", counting)
    traced = spy_on_inverse_cdf(monkeypatch)  # grows when the rollout's sampler traces it
    ctx = RunContext(str(tmp_path), "t")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    policy = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output
    outcome = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)
    history = StageRecord.model_validate(storage.read_json(outcome.record_uri)).history
    # Tunix would roll out one micro-batch at a time (2 calls of 4 rows); FAR asks for one
    assert rows == [recipe.grpo.batch_size * recipe.grpo.num_generations] * STEPS, rows
    assert traced  # traced once per compiled shape, then run compiled
    for phase in TIMED:
        seconds = history[f"far/seconds/{phase}"]
        assert len(seconds) == STEPS and all(np.isfinite(s) and s >= 0 for s in seconds), phase
    for phase in ("rollout", "rollout_prefill", "rollout_decode", "actor_update"):
        assert min(history[f"far/seconds/{phase}"]) > 0, phase
    # one mesh: the rollout shares the actor's weights, so no weight sync ever runs
    assert "far/seconds/weight_sync" not in history
    tags = scalar_tags(Path(outcome.output.uri).parents[1] / "tensorboard")
    assert any(tag.endswith("seconds/rollout") for tag in tags), tags
