"""tunix_compat.target_positions_loss: Tunix's SFT loss projects every position of a row to
the vocabulary and masks all but the completion's; FAR's projects only the loss positions,
with the same loss and gradients to float rounding (the tiny smoke model, LoRA)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stages import sft
from stages.modeling import models, tunix_compat
from tests.conftest import recipe_with

ROWS, LENGTH = 4, 48


def batch(vocab: int) -> dict[str, Any]:
    """Rows of prompt + completion + padding, with 3 to 12 loss targets a row."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, vocab, size=(ROWS, LENGTH)).astype(np.int32)
    mask = np.zeros((ROWS, LENGTH), np.int32)
    segments = np.zeros((ROWS, LENGTH), np.int32)
    for row, (prompt, completion) in enumerate(((20, 12), (30, 3), (8, 9), (25, 7))):
        mask[row, prompt : prompt + completion] = 1
        segments[row, : prompt + completion] = 1
    positions = np.broadcast_to(np.arange(LENGTH), (ROWS, LENGTH)).astype(np.int32)
    return sft.model_inputs(
        {
            "input_tokens": jnp.asarray(tokens),
            "input_mask": jnp.asarray(mask),
            "positions": jnp.asarray(positions),
            "segment_ids": jnp.asarray(segments),
        }
    )


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    root = str(tmp_path_factory.mktemp("loss"))
    recipe = recipe_with(root, "smoke")
    mesh = models.build_mesh(recipe.mesh)
    base = models.build_base_model(recipe.model, mesh, root)
    model = models.apply_lora(base, recipe.sft.lora, mesh)
    # B off zero so the adapters have gradients through both factors
    nnx.update(model, jax.tree.map(lambda x: x + 0.02, nnx.state(model, nnx.LoRAParam)))
    return model, recipe


def loss_and_grads(model: Any, loss_fn: Any, inputs: dict[str, Any]) -> tuple[Any, Any, float]:
    """The loss, its gradient with respect to the adapters, and the gradient's compiled FLOPs
    (as the trainer differentiates: LoRA parameters only)."""
    graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)

    def loss(lora: Any) -> Any:
        return loss_fn(nnx.merge(graphdef, lora, rest), **inputs)

    step = jax.jit(jax.value_and_grad(loss))
    cost = step.lower(lora).compile().cost_analysis()
    value, grads = step(lora)
    return value, grads, float((cost[0] if isinstance(cost, list) else cost)["flops"])


def test_loss_positions_is_the_longest_rows_target_count() -> None:
    mask = np.array([[0, 1, 1, 1, 0], [1, 0, 0, 1, 0], [0, 0, 0, 0, 0]])
    assert tunix_compat.loss_positions(mask) == 3  # row 0's targets (the first token is none)
    assert tunix_compat.loss_positions(np.zeros((2, 4))) == 1


def test_the_loss_at_its_positions_equals_tunixs_and_skips_the_rest(
    network: tuple[Any, Any],
) -> None:
    model, recipe = network
    arch = models.tunix_config(recipe.model)
    inputs = batch(arch.num_embed)
    keep = tunix_compat.loss_positions(inputs["input_mask"])
    assert keep == 12
    ours, our_grads, our_flops = loss_and_grads(
        model, tunix_compat.target_positions_loss(keep), inputs
    )
    theirs, their_grads, their_flops = loss_and_grads(model, tunix_compat.TUNIX_SFT_LOSS, inputs)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)
    for a, b in zip(jax.tree.leaves(our_grads), jax.tree.leaves(their_grads), strict=True):
        # float32 rounding is relative to the leaf's largest terms, not to each element: a
        # gradient of 1e-5 in a leaf of O(1) ones differed by 1.2e-7 (one CI run in 1,284
        # tests), so the absolute floor scales with the leaf (8 ulps of its largest value)
        floor = 1e-6 * float(np.abs(np.asarray(b)).max())
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=floor)
    # Tunix's loss projects all LENGTH - 1 target positions of every row, forward and
    # backward (the activations' gradient): 4 * embed * vocab FLOPs a position; ours `keep`
    skipped = 4 * arch.embed_dim * arch.num_embed * ROWS * (LENGTH - 1 - keep)
    assert their_flops - our_flops >= 0.9 * skipped, (their_flops, our_flops, skipped)
