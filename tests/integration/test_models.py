"""Model building: LoRA clones share the base weights (GRPO's reference costs no copy)."""

from __future__ import annotations

import jax
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


def test_a_copied_lora_policy_owns_its_adapters_and_shares_the_base() -> None:
    """GRPO's actor is a copy of the restored reference: training it (Tunix may donate its
    adapters' buffers) must leave the reference's adapters as they were."""
    recipe = recipe_with("/tmp/unused")
    assert recipe.sft.lora is not None
    mesh = models.build_mesh(recipe.mesh)
    base = models.build_base_model(recipe.model, mesh, cache_dir="unused-for-random-models")
    reference = models.apply_lora(base, recipe.sft.lora, mesh, seed=3)
    actor = models.copy_lora_policy(reference, mesh)
    assert rl_utils.is_sharing_backbone(reference, actor)
    ref_leaves = jax.tree.leaves(nnx.state(reference, nnx.LoRAParam))
    actor_leaves = jax.tree.leaves(nnx.state(actor, nnx.LoRAParam))
    assert len(ref_leaves) == len(actor_leaves) > 0
    for ours, theirs in zip(ref_leaves, actor_leaves, strict=True):
        assert ours is not theirs and jnp.array_equal(ours, theirs)
        assert ours.sharding == theirs.sharding
    before = [jnp.array(leaf) for leaf in ref_leaves]
    for leaf in actor_leaves:
        leaf.delete()  # what donating the actor's adapters to a train step does
    after = jax.tree.leaves(nnx.state(reference, nnx.LoRAParam))
    assert all(jnp.array_equal(b, a) for b, a in zip(before, after, strict=True))


def test_mesh_larger_than_devices_is_a_clear_error() -> None:
    recipe = recipe_with("/tmp/unused", mesh={"fsdp": 64, "tp": 2})
    with pytest.raises(ValueError, match=r"fsdp=64 x tp=2 needs 128 devices, found 1"):
        models.build_mesh(recipe.mesh)
