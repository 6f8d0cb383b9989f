"""SFT on an fsdp=2 x tp=2 mesh of 4 forced CPU devices; prints what got sharded how.

usage: XLA_FLAGS=--xla_force_host_platform_device_count=4 \
    python -m tests.integration._mesh_child ROOT
"""

from __future__ import annotations

import json
import sys

import jax

from stages import sft
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.modeling import models
from tests.conftest import recipe_with


def main(root: str) -> int:
    recipe = recipe_with(
        root,
        mesh={"fsdp": 2, "tp": 2},
        model={"architecture": {"num_kv_heads": 2}},
        sft={"max_steps": 3, "checkpoint_every_steps": 3},
    )
    ctx = RunContext(root=root, run="mesh")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    outcome = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx)
    mesh = models.build_mesh(recipe.mesh)
    base = models.build_base_model(recipe.model, mesh, "unused")
    policy = models.restore_policy(outcome.output, base, mesh)
    attn = policy.layers[0].attn  # type: ignore[attr-defined]
    qkv = attn.qkv_einsum.w.get_value()  # heads == kv heads: Gemma3 fuses q, k and v
    report = {
        "devices": jax.device_count(),
        "mesh": dict(mesh.shape),
        "q_spec": str(qkv.sharding.spec),
        "q_devices": len(qkv.sharding.device_set),
        "ffw_spec": str(policy.layers[0].mlp.gate_proj.kernel.get_value().sharding.spec),  # type: ignore[attr-defined]
        "step": outcome.output.step,
    }
    print("REPORT " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
