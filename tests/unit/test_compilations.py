"""The compile counter sees real XLA compilations, and only of the named function."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from stages.modeling.compilations import counting_compilations


def test_counts_compilations_of_the_named_function() -> None:
    @jax.jit
    def far_probe_step(x: jax.Array) -> jax.Array:
        return x * 2 + 1

    @jax.jit
    def other(x: jax.Array) -> jax.Array:
        return x - 1

    with counting_compilations("far_probe_step") as counter:
        far_probe_step(jnp.ones(3))
        far_probe_step(jnp.ones(3))  # cached: no new compilation
        other(jnp.ones(3))
        assert counter.count == 1
        far_probe_step(jnp.ones(4))  # a new shape compiles again
    assert counter.count == 2
    far_probe_step(jnp.ones(5))  # outside the block: not counted
    assert counter.count == 2
