"""One categorical draw per row with one uniform number per row, for the samplers' decode step.

Why it exists: `jax.random.categorical` draws by the Gumbel-max trick, one random number for
every vocabulary entry of every row. At Gemma 3's 262,144-token vocabulary that is most of a
sampled decode step's cost on this machine's CPU: 124 ms for 32 rows, against 108 ms for
all the step's weight products and 15 ms for the log-softmax Tunix also computes
(bench/results/sampling-cost.json and bf16-matmul.json; docs/log.md, 2026-11-27).
Inverse-CDF sampling needs one uniform per row: the softmax, a cumulative sum, and a search.
A flat cumulative sum over 262,144 entries is itself slow on XLA CPU (38 ms), so it runs in
two levels: sums of blocks of about sqrt(V) entries, the block holding the uniform, then the
entries inside that block (22 ms in all).

The draw is from the same distribution, softmax(logits), up to float32 rounding of the sums
(an entry's share of the total is off by at most a few ulps of the total); it is a different
function of the key, so the tokens drawn for a given seed differ from Gumbel-max's. An entry
of probability 0 (a logit of -inf) is never drawn. Test: tests/unit/test_sampling.py.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def _last_nonzero(mass: jax.Array) -> jax.Array:
    """Index of the last entry of `mass` (last axis) above zero; 0 when none is."""
    n = mass.shape[-1]
    return n - 1 - jnp.argmax(jnp.flip(mass > 0, axis=-1), axis=-1)


def _count_below(cumulative: jax.Array, u: jax.Array) -> jax.Array:
    """How many entries of each row of `cumulative` are below the row's `u`: the index of the
    first entry that reaches it."""
    return jnp.sum(cumulative < u, axis=-1)


def inverse_cdf_categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One index per row of `logits` ([..., V]), drawn from softmax(logits) along the last axis."""
    *batch, vocab = logits.shape
    block = math.isqrt(vocab - 1) + 1 if vocab > 1 else 1
    blocks = -(-vocab // block)
    flat = logits.reshape(-1, vocab).astype(jnp.float32)
    flat = jnp.pad(flat, ((0, 0), (0, blocks * block - vocab)), constant_values=-jnp.inf)
    probs = jax.nn.softmax(flat, axis=-1).reshape(-1, blocks, block)
    block_mass = probs.sum(axis=-1)
    block_cumulative = jnp.cumsum(block_mass, axis=-1)
    u = jax.random.uniform(key, (flat.shape[0], 1)) * block_cumulative[:, -1:]
    # the block holding u; rounding can put u past the last block that has any mass
    j = jnp.minimum(_count_below(block_cumulative, u), _last_nonzero(block_mass))
    before = jnp.where(
        j > 0, jnp.take_along_axis(block_cumulative, (j - 1)[:, None], axis=-1)[:, 0], 0.0
    )
    inner = jnp.take_along_axis(probs, j[:, None, None], axis=1)[:, 0]
    cumulative = before[:, None] + jnp.cumsum(inner, axis=-1)
    i = jnp.minimum(_count_below(cumulative, u), _last_nonzero(inner))
    return (j * block + i).reshape(batch).astype(jnp.int32)
