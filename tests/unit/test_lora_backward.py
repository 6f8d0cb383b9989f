"""The fast path "lora_backward" (tunix_compat._lora_delta): qwix 0.1.8's LoRA backward makes
XLA CPU write each adapted MLP layer's incoming gradient transposed ([hidden x positions])
before the adapters' gradient; the written-out backward does not, and its gradients are
qwix's bit for bit (the tiny smoke model, LoRA on every projection, B moved off zero)."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from qwix._src.providers import lora as qwix_lora

from stages.modeling import fast_paths, models, tunix_compat
from tests.conftest import recipe_with

ROWS, LENGTH = 4, 24


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    root = str(tmp_path_factory.mktemp("lora"))
    recipe = recipe_with(root, "smoke")
    mesh = models.build_mesh(recipe.mesh)
    model = models.apply_lora(
        models.build_base_model(recipe.model, mesh, root), recipe.sft.lora, mesh
    )
    # B off zero so both factors have gradients
    nnx.update(model, jax.tree.map(lambda x: x + 0.02, nnx.state(model, nnx.LoRAParam)))
    return model, models.tunix_config(recipe.model)


def gradient(model: Any, delta: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    """The adapters' gradient of a weighted sum of the logits, with qwix's LoRA delta
    computed by `delta`, and the compiled gradient's HLO text."""
    monkeypatch.setattr(qwix_lora, "_compute_lora_delta", delta)
    graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
    tokens = jax.random.randint(jax.random.key(0), (ROWS, LENGTH), 3, 500)
    positions = jnp.broadcast_to(jnp.arange(LENGTH), tokens.shape)
    mask = jnp.tril(jnp.ones((LENGTH, LENGTH), bool))[None]
    weights = jax.random.normal(jax.random.key(1), (ROWS, LENGTH, 1))

    def loss(lora: Any) -> Any:
        logits, _ = nnx.merge(graphdef, lora, rest)(tokens, positions, None, mask)
        return jnp.sum(logits * weights)

    step = jax.jit(jax.grad(loss))
    return step(lora), step.lower(lora).compile().as_text()


def transposed_mlp_gradients(hlo: str, hidden: int) -> int:
    """Fusions writing an MLP-wide [hidden x positions] array: the incoming gradient
    transposed."""
    shape = rf"f32\[{hidden},{ROWS * LENGTH}\]"
    return len(re.findall(rf"^\s*%\S+ = {shape}\{{1,0\}} fusion\(", hlo, flags=re.M))


def test_qwix_transposes_the_gradient_and_the_written_out_backward_does_not(
    network: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, arch = network
    theirs, their_hlo = gradient(model, tunix_compat.QWIX_COMPUTE_LORA_DELTA, monkeypatch)
    ours, our_hlo = gradient(model, tunix_compat._lora_delta, monkeypatch)
    # the defect, on qwix alone: gate and up of each layer
    assert transposed_mlp_gradients(their_hlo, arch.hidden_dim) >= arch.num_layers
    assert transposed_mlp_gradients(our_hlo, arch.hidden_dim) == 0
    leaves = list(zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True))
    assert all(float(jnp.abs(b).max()) > 0 for _, b in leaves)
    for a, b in leaves:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_installing_routes_qwix_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with fast_paths.installed("lora_backward"):
        assert qwix_lora._compute_lora_delta is tunix_compat._lora_delta
    assert qwix_lora._compute_lora_delta is tunix_compat.QWIX_COMPUTE_LORA_DELTA
    monkeypatch.setattr(tunix_compat, "TESTED_QWIX_VERSIONS", ("0.0.0",))
    with fast_paths.installed("lora_backward"):  # an untested qwix keeps its own
        assert qwix_lora._compute_lora_delta is tunix_compat.QWIX_COMPUTE_LORA_DELTA


def test_other_shapes_go_to_qwix() -> None:
    x = jnp.ones((2, 3, 4))
    a, b = jnp.ones((2, 4, 5)), jnp.ones((2, 5, 6))  # a batch axis: not a linear layer
    ours = tunix_compat._lora_delta(x, a, b, (2,), (0,), (4,), (2,), (6,), 5)
    theirs = tunix_compat.QWIX_COMPUTE_LORA_DELTA(x, a, b, (2,), (0,), (4,), (2,), (6,), 5)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
