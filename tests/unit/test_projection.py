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


def textbook_entropy(hidden: Any, embedding: Any, temperature: float) -> Any:
    """Tunix's own entropy (compute_entropy_from_logits, where tunix_api finds it) of the same
    logits."""
    from stages.modeling import tunix_api

    logits = hidden @ embedding.T
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    return tunix_api.ENTROPY_MODULE.compute_entropy_from_logits(logits)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_entropy_and_its_gradient_equal_tunixs(
    inputs: tuple[Any, ...], temperature: float
) -> None:
    """token_logps_entropy: the log-probs are token_logps', the entropy Tunix's; a loss
    with both (as PPO's entropy term would train on) has autodiff's gradients."""
    hidden, embedding, targets, weights = inputs
    function = jax.jit(projection.token_logps_entropy, static_argnums=3)
    logps, entropy = function(hidden, embedding, targets, temperature)
    plain = textbook_entropy(hidden, embedding, temperature)
    np.testing.assert_array_equal(
        np.asarray(logps),
        np.asarray(projection.token_logps(hidden, embedding, targets, temperature)),
    )
    assert entropy.shape == targets.shape and float(entropy.min()) > 0.1
    np.testing.assert_allclose(np.asarray(entropy), np.asarray(plain), rtol=1e-5, atol=1e-5)

    def ours(h: Any, e: Any) -> Any:
        logps, entropy = projection.token_logps_entropy(h, e, targets, temperature)
        return jnp.sum(logps * weights) + jnp.sum(entropy * weights[::-1])

    def theirs(h: Any, e: Any) -> Any:
        return jnp.sum(textbook(h, e, targets, temperature) * weights) + jnp.sum(
            textbook_entropy(h, e, temperature) * weights[::-1]
        )

    for a, b in zip(
        jax.jit(jax.grad(ours, argnums=(0, 1)))(hidden, embedding),
        jax.grad(theirs, argnums=(0, 1))(hidden, embedding),
        strict=True,
    ):
        assert float(jnp.abs(b).max()) > 0
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_either_output_alone_has_autodiffs_gradient(inputs: tuple[Any, ...]) -> None:
    """An unused output's cotangent arrives as a symbolic zero (GRPO logs the entropy and
    trains on the log-probs): its term is skipped, and the other's gradient is unchanged."""
    hidden, embedding, targets, weights = inputs

    def grad(of: Any, index: int) -> Any:
        return jax.grad(lambda h: jnp.sum(of(h)[index] * weights))(hidden)

    def ours(h: Any) -> Any:
        return projection.token_logps_entropy(h, embedding, targets)

    def theirs(h: Any) -> Any:
        return textbook(h, embedding, targets, 1.0), textbook_entropy(h, embedding, 1.0)

    for index in (0, 1):
        np.testing.assert_allclose(
            np.asarray(grad(ours, index)), np.asarray(grad(theirs, index)), rtol=1e-4, atol=1e-5
        )
