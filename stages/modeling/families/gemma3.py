"""Gemma 3 (tunix.models.gemma3): FAR's first family, and the only one `source: gguf` reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from schemas.recipe import Architecture
from stages.modeling import hf_config as hf
from stages.modeling.families.base import arr
from stages.modeling.families.gemma import GemmaFamily, attention_tensors, mlp_tensors


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

    def tiny_config(self, arch: Architecture, dtype: Any) -> Any:
        return self.tunix_module().ModelConfig(**arch.model_dump(), param_dtype=dtype)

    def preset_config(self, preset: str, dtype: Any) -> Any:
        return dataclasses.replace(super().preset_config(preset, dtype), param_dtype=dtype)

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
        )
        return hf.gemma3_text_config(shape)


FAMILY = Gemma3Family()
