"""Gemma 3 (tunix.models.gemma3): FAR's first family, and the only one `source: gguf` reads.

A Hugging Face checkpoint (`source: safetensors` or `hub`) is described by its config.json
(`checkpoint_config`): shapes, both RoPE bases and their linear scaling (Tunix's
`global_scale_factor` / `local_scale_factor`), the sliding window and the query scale. What
Tunix's network hard-codes (the RMSNorm epsilon, the five-local-one-global layer pattern, no
logit soft caps, tied embeddings, tanh GELU) is checked against config.json and a checkpoint
that asks for anything else is refused, naming the key: it would load and compute other
logits than transformers does. A preset or architecture given beside such a checkpoint must
agree with its config.json on every field that changes the network (`network_fields`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from schemas.recipe import Architecture
from stages.core.errors import InputError
from stages.modeling import hf_config as hf
from stages.modeling.families.base import arr
from stages.modeling.families.decoder import read_hf_config
from stages.modeling.families.gemma import GemmaFamily, attention_tensors, mlp_tensors

# transformers' Gemma3TextConfig defaults: what a config.json that omits a key means
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "sliding_window_pattern": hf.GLOBAL_ATTENTION_EVERY,
}
# config.json keys whose value Tunix's Gemma 3 network hard-codes: any other value is refused
FIXED_BY_TUNIX: dict[str, Any] = {
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "use_bidirectional_attention": False,
}
ROPE_TYPES = ("default", "linear")  # what Tunix's apply_rope computes (linear: scale_factor)


def text_config(directory: str) -> dict[str, Any]:
    """config.json's text model: the file itself (Gemma3ForCausalLM) or its `text_config`
    (Gemma3ForConditionalGeneration, the 4B and larger sizes)."""
    config = read_hf_config(directory)
    return dict(config.get("text_config") or config)


def _refuse(directory: str, what: str, expected: str) -> InputError:
    return InputError(
        f"{os.path.join(directory, 'config.json')}: {what}, but Tunix's Gemma 3 network "
        f"computes {expected}; FAR would load it and compute other logits than transformers, "
        f"so it is refused: use a Gemma 3 checkpoint with that value"
    )


def rope_entries(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(full-attention, sliding-attention) RoPE entries, in either config.json layout:
    transformers 5's per-layer-type `rope_parameters`, or `rope_theta` + `rope_scaling` for
    full attention and `rope_local_base_freq` (no scaling) for sliding attention."""
    params = config.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = params.get("full_attention") or {}
        sliding = params.get("sliding_attention") or {}
        return (
            {"rope_theta": HF_DEFAULTS["rope_theta"], **full},
            {"rope_theta": HF_DEFAULTS["rope_local_base_freq"], **sliding},
        )
    scaling = config.get("rope_scaling") or params
    full = {"rope_theta": config.get("rope_theta", HF_DEFAULTS["rope_theta"]), **scaling}
    base = config.get("rope_local_base_freq", HF_DEFAULTS["rope_local_base_freq"])
    return full, {"rope_theta": base}


def rope_base_and_factor(entry: dict[str, Any], which: str, directory: str) -> tuple[Any, float]:
    """A RoPE entry as Tunix's (base frequency, scale factor)."""
    kind = str(entry.get("rope_type", entry.get("type", "default")))
    factor = float(entry.get("factor", 1.0)) if kind == "linear" else 1.0
    if kind not in ROPE_TYPES or factor < 1.0:
        raise _refuse(
            directory,
            f"{which} RoPE is rope_type {kind!r} (factor {entry.get('factor')})",
            "default RoPE or linear scaling by a factor >= 1",
        )
    theta = float(entry["rope_theta"])
    return (int(theta) if theta.is_integer() else theta), factor


def layer_types(config: dict[str, Any]) -> list[str]:
    """The attention type of each layer, as config.json gives it (either layout)."""
    if config.get("layer_types"):
        return list(config["layer_types"])
    every = int(config.get("sliding_window_pattern") or HF_DEFAULTS["sliding_window_pattern"])
    layers = int(config.get("num_hidden_layers", HF_DEFAULTS["num_hidden_layers"]))
    return hf.gemma3_layer_types(layers, every)


def _same(found: Any, expected: Any) -> bool:
    """Equal, numbers within float32 rounding (a GGUF file stores its epsilon as float32)."""
    if isinstance(found, bool) or isinstance(expected, bool):
        return found is expected
    if isinstance(found, int | float) and isinstance(expected, int | float):
        return math.isclose(found, expected, rel_tol=1e-6)
    return bool(found == expected)


def check_fixed(config: dict[str, Any], directory: str) -> None:
    """Refuse a config.json that sets what Tunix's network hard-codes to another value."""
    for key, expected in FIXED_BY_TUNIX.items():
        found = config.get(key, expected)
        if not _same(found, expected):
            raise _refuse(directory, f"{key} is {found!r}", f"{key} {expected!r} only")
    layers = int(config.get("num_hidden_layers", HF_DEFAULTS["num_hidden_layers"]))
    found = layer_types(config)
    if found != hf.gemma3_layer_types(layers):
        raise _refuse(
            directory,
            f"layer_types is {found}",
            "five sliding-window layers, then one full-attention layer, repeated",
        )


class Gemma3Family(GemmaFamily):
    name = "gemma3"
    tunix_package = "tunix.models.gemma3"
    network_class_name = "Gemma3"
    presets: ClassVar[Mapping[str, str]] = {
        "gemma3_270m": "gemma3_270m",
        "gemma3_1b": "gemma3_1b_pt",
        "gemma3_4b": "gemma3_4b_pt",
    }
    reads_gguf = True
    reads_config_json = True
    network_fields: ClassVar[Mapping[str, str]] = {
        "num_layers": "num_hidden_layers",
        "num_embed": "vocab_size",
        "embed_dim": "hidden_size",
        "hidden_dim": "intermediate_size",
        "num_heads": "num_attention_heads",
        "head_dim": "head_dim",
        "num_kv_heads": "num_key_value_heads",
        "sliding_window_size": "sliding_window",
        "global_base_frequency": "the full-attention rope_theta",
        "local_base_frequency": "the sliding-attention rope_theta (rope_local_base_freq)",
        "global_scale_factor": "the full-attention linear RoPE factor",
        "local_scale_factor": "the sliding-attention linear RoPE factor",
        "query_pre_attn_norm": "query_pre_attn_scalar",
    }

    def tiny_config(self, arch: Architecture, dtype: Any) -> Any:
        return self.tunix_module().ModelConfig(**arch.model_dump(), param_dtype=dtype)

    def preset_config(self, preset: str, dtype: Any) -> Any:
        return dataclasses.replace(super().preset_config(preset, dtype), param_dtype=dtype)

    def check_checkpoint(self, directory: str) -> None:
        """Refuse a config.json asking for what Tunix's Gemma 3 network does not compute
        (a checkpoint without config.json, such as a Kaggle one, is described by its preset)."""
        if os.path.exists(os.path.join(directory, "config.json")):
            self.checkpoint_config(directory, np.float32)

    def checkpoint_config(self, directory: str, dtype: Any) -> Any:
        """Tunix's Gemma 3 ModelConfig from config.json (refused where Tunix computes other)."""
        config = HF_DEFAULTS | text_config(directory)
        check_fixed(config, directory)
        full, sliding = rope_entries(config)
        global_base, global_factor = rope_base_and_factor(full, "full-attention", directory)
        local_base, local_factor = rope_base_and_factor(sliding, "sliding-attention", directory)
        model = self.tunix_module()
        return model.ModelConfig(
            num_layers=int(config["num_hidden_layers"]),
            num_embed=int(config["vocab_size"]),
            embed_dim=int(config["hidden_size"]),
            hidden_dim=int(config["intermediate_size"]),
            num_heads=int(config["num_attention_heads"]),
            head_dim=int(config["head_dim"]),
            num_kv_heads=int(config["num_key_value_heads"]),
            sliding_window_size=int(config["sliding_window"]),
            local_base_frequency=local_base,
            global_base_frequency=global_base,
            local_scale_factor=local_factor,
            global_scale_factor=global_factor,
            query_pre_attn_norm=self._query_norm(model, config, directory),
            param_dtype=dtype,
        )

    @staticmethod
    def _query_norm(model: Any, config: dict[str, Any], directory: str) -> Any:
        """Tunix scales queries by head_dim ** -0.5 or (hidden_size // heads) ** -0.5 only."""
        scalar, head_dim = config["query_pre_attn_scalar"], int(config["head_dim"])
        per_head = int(config["hidden_size"]) // int(config["num_attention_heads"])
        norm = model.QueryPreAttentionNormalisation
        if scalar == head_dim:
            return norm.BY_ONE_OVER_SQRT_HEAD_DIM
        if scalar == per_head:
            return norm.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS
        raise _refuse(
            directory,
            f"query_pre_attn_scalar is {scalar!r}",
            f"head_dim ({head_dim}) or hidden_size // num_attention_heads ({per_head}) only",
        )

    def layer_tensors(self, layer: Any, config: Any) -> dict[str, np.ndarray]:
        from stages.modeling import tunix_compat  # deferred: imports Tunix

        q_norm, k_norm = tunix_compat.gemma3_qk_norm_scales(layer.attn)
        return {
            **attention_tensors(layer.attn, config),
            **mlp_tensors(layer.mlp),
            "self_attn.q_norm.weight": arr(q_norm),
            "self_attn.k_norm.weight": arr(k_norm),
            "input_layernorm.weight": arr(layer.pre_attention_norm.scale),
            "post_attention_layernorm.weight": arr(layer.post_attention_norm.scale),
            "pre_feedforward_layernorm.weight": arr(layer.pre_ffw_norm.scale),
            "post_feedforward_layernorm.weight": arr(layer.post_ffw_norm.scale),
        }

    def hf_config(self, config: Any) -> dict[str, Any]:
        shape = hf.Gemma3TextShape(
            hidden_size=config.embed_dim,
            intermediate_size=config.hidden_dim,
            num_layers=config.num_layers,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            sliding_window=config.sliding_window_size,
            vocab_size=config.num_embed,
            full_rope=hf.rope(config.global_base_frequency, config.global_scale_factor),
            sliding_rope=hf.rope(config.local_base_frequency, config.local_scale_factor),
            query_pre_attn_scalar=self._query_scalar(config),
        )
        return hf.gemma3_text_config(shape)

    @staticmethod
    def _query_scalar(config: Any) -> int:
        """The config.json value `_query_norm` reads back: head_dim, or hidden // heads."""
        per_head = config.query_pre_attn_norm.name == "BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS"
        return config.embed_dim // config.num_heads if per_head else config.head_dim


FAMILY = Gemma3Family()
