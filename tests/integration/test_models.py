"""Model building: LoRA clones share the base weights (GRPO's reference costs no copy)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from flax import nnx
from tunix.rl import utils as rl_utils

from stages.modeling import models
from tests.conftest import recipe_with


def test_lora_clone_shares_base_and_leaves_it_unchanged() -> None:
    recipe = recipe_with("/tmp/unused")
    assert recipe.sft.lora is not None
    mesh = models.build_mesh(recipe.mesh)
    base = models.build_base_model(recipe.model, mesh, cache_dir="unused-for-random-models")
    policy = models.apply_lora(base, recipe.sft.lora, mesh)
    assert rl_utils.is_sharing_backbone(base, policy)
    assert nnx.state(base, nnx.LoRAParam) == nnx.State({})  # base stays LoRA-free
    adapters = nnx.state(policy, nnx.LoRAParam)
    assert len(adapters.flat_state()) > 0
    tokens = jnp.ones((1, 4), dtype=jnp.int32)
    positions = jnp.arange(4)[None]
    mask = jnp.tril(jnp.ones((1, 4, 4), dtype=bool))
    with mesh:
        base_logits, _ = base(tokens, positions, None, mask)
        policy_logits, _ = policy(tokens, positions, None, mask)
    # fresh LoRA has B = 0: the clone computes exactly what the base computes
    assert jnp.allclose(base_logits, policy_logits, atol=1e-6)


def test_mesh_larger_than_devices_is_a_clear_error() -> None:
    recipe = recipe_with("/tmp/unused", mesh={"fsdp": 64, "tp": 2})
    with pytest.raises(ValueError, match=r"fsdp=64 x tp=2 needs 128 devices, found 1"):
        models.build_mesh(recipe.mesh)
