"""Tunix's GRPO resume defects, measured with the rollout model on its own CPU device.

Trains 3 GRPO steps with checkpoints every 2 (so Tunix's close() writes the step-3 checkpoint,
with empty metadata), then restores that run twice: once with the rollout on a second device
(a real copy of the weights) and once sharing the actor's mesh. Prints what it measured,
before and after `tunix_compat.resync_after_restore`.

usage: XLA_FLAGS=--xla_force_host_platform_device_count=2 \
    python -m tests.integration._grpo_resume_child ROOT
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from stages import sft
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.grpo import training as grpo
from stages.modeling import tunix_compat
from tests.conftest import recipe_with, use_session_compile_cache


def lora_max_difference(a: Any, b: Any) -> float:
    left, right = (jax.tree.leaves(nnx.state(m, nnx.LoRAParam)) for m in (a, b))
    return max(
        float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(left, right, strict=True)
    )


def follows(actor: Any, rollout: Any) -> bool:
    """Whether an update of the actor's adapters (in place, as the trainer does) reaches the
    rollout model without a sync."""
    nnx.update(actor, jax.tree.map(lambda x: x + 1.0, nnx.state(actor, nnx.LoRAParam)))
    return lora_max_difference(actor, rollout.model()) == 0.0


def main(root: str) -> int:
    use_session_compile_cache()
    recipe = recipe_with(
        root, sft={"max_steps": 4}, grpo={"max_steps": 3, "checkpoint_every_steps": 2}
    )
    ctx = RunContext(root, "d")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    policy = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output
    outcome = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)
    stage_dir = Path(outcome.output.uri).parents[1]
    second = jax.sharding.Mesh(
        np.asarray(jax.devices()[1:2]).reshape(1, 1),
        ("fsdp", "tp"),
        axis_types=(jax.sharding.AxisType.Auto,) * 2,
    )
    report: dict[str, Any] = {}
    for name, rollout_mesh in (("apart", second), ("shared", None)):
        copy = Path(root) / f"copy-{name}"
        shutil.copytree(stage_dir, copy)
        session = grpo.build_session(
            str(copy),
            dataset,
            policy,
            recipe.grpo,
            recipe.model,
            recipe.mesh,
            ctx,
            rollout_mesh=rollout_mesh,
        )
        cluster = session.cluster
        actor, rollout = cluster.actor_trainer.model, cluster.rollout
        report[name] = {
            "restored_step": session.steps_done(recipe.grpo),
            "global_step_before": cluster.global_steps,
            "rollout_diff_before": lora_max_difference(actor, rollout.model()),
        }
        tunix_compat.resync_after_restore(cluster, session.learner, session.steps_done(recipe.grpo))
        report[name].update(
            global_step_after=cluster.global_steps,
            rollout_diff_after=lora_max_difference(actor, rollout.model()),
            rollout_follows_actor_after=follows(actor, rollout),
        )
    print("REPORT " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
