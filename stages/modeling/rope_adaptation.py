"""RoPE as the checkpoint's config.json says, in Tunix's Qwen 3 and Llama 3 networks.

Tunix 0.1.7 (google-tunix 0.1.7; tunix/models/qwen3/model.py and llama3/model.py) has
`Attention.block` call its module's `apply_rope(x, positions, head_dim=...)` without the
config's `rope_theta`, so every network rotates with that function's default base (1e6) and
no frequency scaling, whatever its ModelConfig says. Real Llama 3.x checkpoints use base
500000 with `rope_scaling` of type 'llama3' (Llama 3.1 / 3.2), and some Qwen 3 sizes another
base: loaded as they are, their weights compute other logits than transformers does.

FAR's adaptation, a patch-ledger entry rather than a fork (`install`):
- `Attention.block` is wrapped so that, while it runs, the layer's own config is the current
  one (a context variable read at trace time);
- the module's `apply_rope` is replaced by one that takes the base from that config (its
  `rope_theta`) and, for a `ScaledRope*Config` (the family's ModelConfig plus a `rope_scaling`
  field), the Llama 3 frequency scaling as transformers computes it. Without scaling it calls
  Tunix's own `apply_rope` with the config's base, so a network whose base is Tunix's default
  computes bit for bit what it did before.
Removal test: tests/unit/test_rope_adaptation.py::test_tunix_still_ignores_the_config_base
fails once Tunix passes the config's base itself; then this module can go (scaling still
needs it until Tunix reads `rope_scaling`).
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

ROPE_SCALING_KEYS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)
_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("far_rope_config", default=None)
_SCALED_CLASSES: dict[type, type] = {}


def install(module: Any) -> None:
    """Adapt a Tunix model module (tunix.models.qwen3.model or llama3.model), once."""
    if getattr(module, "_far_rope_adapted", False):
        return
    tunix_block, tunix_rope = module.Attention.block, module.apply_rope

    def block(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _CURRENT.set(self.config)
        try:
            return tunix_block(self, *args, **kwargs)
        finally:
            _CURRENT.reset(token)

    def apply_rope(inputs: Any, positions: Any, head_dim: int, rope_theta: Any = None) -> Any:
        config = _CURRENT.get()
        if config is None:  # called outside an attention block: Tunix's behaviour
            base = {} if rope_theta is None else {"rope_theta": rope_theta}
            return tunix_rope(inputs, positions, head_dim, **base)
        scaling = getattr(config, "rope_scaling", None)
        if not scaling:
            return tunix_rope(inputs, positions, head_dim, rope_theta=config.rope_theta)
        frequencies = llama3_inverse_frequencies(head_dim, config.rope_theta, dict(scaling))
        return rotate(inputs, positions, frequencies)

    block.__wrapped__ = tunix_block  # type: ignore[attr-defined]
    apply_rope.__wrapped__ = tunix_rope  # type: ignore[attr-defined]
    module.Attention.block = block
    module.apply_rope = apply_rope
    module._far_rope_adapted = True


def llama3_inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, float]
) -> np.ndarray:
    """transformers' `_compute_llama3_parameters`: long wavelengths divided by `factor`, short
    ones kept, the band between interpolated smoothly (float32, as transformers computes)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    inverse = (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inverse
    scaled = np.where(wavelength > context / low, inverse / factor, inverse)
    smooth = (context / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= context / high) & (wavelength <= context / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rotate(inputs: Any, positions: Any, inverse_frequencies: np.ndarray) -> Any:
    """Tunix's rotation (the two halves of each head) with given inverse frequencies."""
    angles = positions[..., jnp.newaxis] * jnp.asarray(inverse_frequencies)[None, None, :]
    angles = angles[..., jnp.newaxis, :]
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    first, second = jnp.split(inputs, 2, axis=-1)
    out = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return out.astype(inputs.dtype)


def scaled_config(config: Any, scaling: dict[str, float]) -> Any:
    """`config` (a Tunix Qwen3 / Llama3 ModelConfig) carrying Llama 3 RoPE scaling."""
    base = type(config)
    if base not in _SCALED_CLASSES:
        params = base.__dataclass_params__
        _SCALED_CLASSES[base] = dataclasses.make_dataclass(
            f"ScaledRope{base.__name__}",
            [("rope_scaling", tuple, dataclasses.field(default=()))],
            bases=(base,),
            frozen=params.frozen,
        )
        _SCALED_CLASSES[base].__module__ = __name__
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    items = tuple((key, float(scaling[key])) for key in ROPE_SCALING_KEYS)
    return _SCALED_CLASSES[base](**fields, rope_scaling=items)


def rope_scaling(config: Any) -> dict[str, float] | None:
    """The Llama 3 scaling a config carries (as transformers writes it: the original context
    an integer), or None."""
    found = getattr(config, "rope_scaling", None)
    if not found:
        return None
    out = dict(found)
    out["original_max_position_embeddings"] = int(out["original_max_position_embeddings"])
    return out
