"""Log-probabilities of chosen tokens through a tied output projection, in one function.

Why it exists: SFT's loss and every GRPO log-prob (actor loss, reference, old policy) need
only log p(target) at each position, i.e. the target's logit and the log-sum-exp over the
vocabulary. The textbook path, `log_softmax(hidden @ embedding.T)` then a gather, is what
Tunix and FAR's first versions ran; on this machine's XLA CPU backend it is the slowest part
of a LoRA train step at Gemma 3's 262,144-token vocabulary. Measured on 2 cores, 144
positions (the demo's SFT step), forward and gradient with respect to the hidden states
(`bench/roofline.py`; the experiment is in docs/log.md):

* the projection as `hidden @ embedding.T` gives a [positions, vocabulary] array; the same
  numbers as `embedding @ hidden.T`, vocabulary-major, come out about twice as fast
  forward, and the backward's `d_logits @ embedding` (a 262,144-long reduction) runs at half
  the speed of the same product with vocabulary-major cotangents;
* the gather's gradient materialises a zero [positions, vocabulary] array and scatters into
  it, and the log-softmax's gradient makes another two.

Here the logits are computed vocabulary-major, only their log-sum-exp and the targets' logits
leave the forward pass, and the backward is written out (`custom_vjp`): the softmax times the
incoming gradient, one product with the embedding, plus the targets' embedding rows. The
values are the same per position up to the order of float sums (test:
tests/unit/test_projection.py); the gradient with respect to the embedding is written too
(full-weight training) and compiled away when only adapters train.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def token_logps(
    hidden: jax.Array, embedding: jax.Array, targets: jax.Array, temperature: float = 1.0
) -> jax.Array:
    """log softmax(hidden @ embedding.T / temperature)[targets] at each position.

    hidden: [..., embed] (after the final norm); embedding: [vocabulary, embed], the tied
    input embedding Gemma decodes with; targets: [...] token ids. Returns [...] float.
    `temperature` 0 or 1 leaves the logits unscaled (as Tunix's log-prob function does).
    """
    return _forward(hidden, embedding, targets, temperature)[0]


def _scale(temperature: float) -> float:
    return 1.0 if temperature in (0.0, 1.0) else 1.0 / temperature


def _forward(
    hidden: jax.Array, embedding: jax.Array, targets: jax.Array, temperature: float
) -> tuple[jax.Array, tuple[Any, ...]]:
    flat = hidden.reshape(-1, hidden.shape[-1])
    chosen = targets.reshape(-1)
    logits = jnp.dot(embedding, flat.T)  # [vocabulary, positions]: vocabulary-major
    scale = _scale(temperature)
    if scale != 1.0:
        logits = logits * scale
    log_norm = jax.nn.logsumexp(logits, axis=0)
    picked = logits[chosen, jnp.arange(chosen.shape[0])]
    out = (picked - log_norm).reshape(targets.shape)
    return out, (flat, embedding, chosen, logits, log_norm)


def _backward(
    temperature: float, saved: tuple[Any, ...], grad: jax.Array
) -> tuple[jax.Array, jax.Array, None]:
    return _gradients(temperature, saved, grad, None)


def _gradients(
    temperature: float, saved: tuple[Any, ...], grad: jax.Array, grad_entropy: Any
) -> tuple[jax.Array, jax.Array, None]:
    """The gradients of the log-probs (and, with `grad_entropy`, of the entropies) with
    respect to the hidden states and the embedding."""
    flat, embedding, chosen, logits, log_norm = saved[:5]
    g = grad.reshape(-1) * _scale(temperature)  # d out / d (unscaled logit) carries the scale
    probs = jnp.exp(logits - log_norm)  # [vocabulary, positions]: the softmax
    if grad_entropy is None:
        d_logits = -probs * g  # d log p(target) / d logit = onehot - softmax
    else:  # d H / d logit = -softmax * (log softmax + H), at the same scale
        entropy = saved[5]
        h = grad_entropy.reshape(-1) * _scale(temperature)
        d_logits = -probs * (g + h * (logits - log_norm + entropy))
    rows = jnp.take(embedding, chosen, axis=0)
    d_hidden = jnp.dot(d_logits.T, embedding) + g[:, None] * rows
    d_embedding = jnp.dot(d_logits, flat).at[chosen].add(g[:, None] * flat)
    return d_hidden.reshape(*grad.shape, flat.shape[-1]), d_embedding, None


token_logps.defvjp(_forward, _backward)  # the forward pass keeps what the backward reads


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def token_logps_entropy(
    hidden: jax.Array, embedding: jax.Array, targets: jax.Array, temperature: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """token_logps and, at each position, the entropy of the same softmax, from one
    projection: H = log-sum-exp - sum(softmax * logit), one more reduction over the
    vocabulary-major logits token_logps already makes. Both differentiable (GRPO reports the
    entropy; a loss with an entropy term trains on it)."""
    (out, entropy), _ = _forward_entropy(hidden, embedding, targets, temperature)
    return out, entropy


def _forward_entropy(
    hidden: Any, embedding: Any, targets: Any, temperature: float
) -> tuple[tuple[jax.Array, jax.Array], tuple[Any, ...]]:
    hidden, embedding, targets = (getattr(x, "value", x) for x in (hidden, embedding, targets))
    out, saved = _forward(hidden, embedding, targets, temperature)
    logits, log_norm = saved[3], saved[4]
    entropy = log_norm - jnp.sum(jnp.exp(logits - log_norm) * logits, axis=0)
    return (out, entropy.reshape(targets.shape)), (*saved, entropy)


def _backward_entropy(
    temperature: float, saved: tuple[Any, ...], grads: tuple[Any, Any]
) -> tuple[Any, Any, None]:
    """A zero cotangent arrives symbolic (GRPO reads the entropy as a metric only): its term,
    a pass over the vocabulary-wide logits, is then not computed at all."""
    zero = jax.custom_derivatives.SymbolicZero
    grad, grad_entropy = grads
    if isinstance(grad, zero):
        grad = jnp.zeros(grad.shape, grad.dtype)  # the log-probs unused: only the entropy trains
    return _gradients(
        temperature, saved, grad, None if isinstance(grad_entropy, zero) else grad_entropy
    )


# symbolic_zeros: the forward rule gets its arguments wrapped (`.value`), the backward rule
# learns which cotangents are zero
token_logps_entropy.defvjp(_forward_entropy, _backward_entropy, symbolic_zeros=True)
