"""projection.token_logps: the fused log-prob of chosen tokens equals the textbook
log_softmax(hidden @ embedding.T)[targets], values and gradients (with respect to the hidden
states and to the embedding), to float rounding, with and without a temperature."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stages.modeling import projection

VOCAB, EMBED = 512, 16


def textbook(hidden: Any, embedding: Any, targets: Any, temperature: float) -> Any:
    logits = hidden @ embedding.T
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logps = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logps, targets[..., None], axis=-1)[..., 0]


@pytest.fixture(scope="module")
def inputs() -> tuple[Any, Any, Any, Any]:
    keys = jax.random.split(jax.random.key(0), 4)
    hidden = jax.random.normal(keys[0], (3, 5, EMBED))
    embedding = jax.random.normal(keys[1], (VOCAB, EMBED)) * 0.5
    targets = jax.random.randint(keys[2], (3, 5), 0, VOCAB).at[0, :2].set(7)  # a repeated id
    weights = jax.random.normal(keys[3], (3, 5))  # an uneven incoming gradient
    return hidden, embedding, targets, weights


@pytest.mark.parametrize("temperature", [1.0, 0.0, 0.7])
def test_values_and_gradients_equal_the_textbook_path(
    inputs: tuple[Any, ...], temperature: float
) -> None:
    hidden, embedding, targets, weights = inputs

    def loss(function: Any) -> Any:
        return lambda h, e: jnp.sum(function(h, e, targets, temperature) * weights)

    fused = jax.jit(projection.token_logps, static_argnums=3)(
        hidden, embedding, targets, temperature
    )
    plain = textbook(hidden, embedding, targets, temperature)
    assert fused.shape == targets.shape
    np.testing.assert_allclose(np.asarray(fused), np.asarray(plain), rtol=1e-5, atol=1e-5)
    ours = jax.jit(jax.grad(loss(projection.token_logps), argnums=(0, 1)))(hidden, embedding)
    theirs = jax.grad(loss(textbook), argnums=(0, 1))(hidden, embedding)
    for a, b in zip(ours, theirs, strict=True):
        assert float(jnp.abs(b).max()) > 0
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_a_stopped_gradient_stops_it(inputs: tuple[Any, ...]) -> None:
    hidden, embedding, targets, _ = inputs
    grad = jax.grad(
        lambda h: jnp.sum(jax.lax.stop_gradient(projection.token_logps(h, embedding, targets)))
    )(hidden)
    assert float(jnp.abs(grad).max()) == 0.0
