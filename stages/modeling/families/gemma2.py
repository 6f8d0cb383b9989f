"""Gemma 2 (tunix.models.gemma): alternating local/global attention and logit soft caps.

Tunix's gemma module also holds Gemma 1 configs (no post-attention / post-FFW norms); those
are refused at export, which writes Gemma 2's layout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from schemas.recipe import Architecture
from stages.core.errors import InputError
from stages.modeling import hf_config as hf
from stages.modeling.families.base import arr
from stages.modeling.families.gemma import GemmaFamily, attention_tensors, mlp_tensors

# Tunix's Gemma 1/2 attention applies RoPE with its default base wavelength, not a config field
ROPE_THETA = 10_000.0


class Gemma2Family(GemmaFamily):
    name = "gemma2"
    tunix_package = "tunix.models.gemma"
    network_class_name = "Gemma"
    presets: ClassVar[Mapping[str, str]] = {"gemma2_2b": "gemma2_2b"}

    def tiny_config(self, arch: Architecture, dtype: Any) -> Any:
        """Gemma 2's layout (alternating local/global attention, soft caps) at test size."""
        model = self.tunix_module()
        pattern = (model.AttentionType.LOCAL_SLIDING, model.AttentionType.GLOBAL)
        return model.ModelConfig(
            **arch.model_dump(),
            final_logit_softcap=30.0,
            use_post_attn_norm=True,
            use_post_ffw_norm=True,
            attention_types=tuple(pattern[i % 2] for i in range(arch.num_layers)),
            attn_logits_soft_cap=50.0,
        )

    def layer_tensors(self, layer: Any, config: Any) -> dict[str, np.ndarray]:
        """Gemma 2 names its post-attention norm post_attn_norm."""
        return {
            **attention_tensors(layer.attn, config),
            **mlp_tensors(layer.mlp),
            "input_layernorm.weight": arr(layer.pre_attention_norm.scale),
            "post_attention_layernorm.weight": arr(layer.post_attn_norm.scale),
            "pre_feedforward_layernorm.weight": arr(layer.pre_ffw_norm.scale),
            "post_feedforward_layernorm.weight": arr(layer.post_ffw_norm.scale),
        }

    def hf_tensors(self, network: Any, config: Any) -> dict[str, np.ndarray]:
        _check_gemma2(config)
        return super().hf_tensors(network, config)

    def hf_config(self, config: Any) -> dict[str, Any]:
        _check_gemma2(config)
        layer_types = {
            self.tunix_module().AttentionType.LOCAL_SLIDING: "sliding_attention",
            self.tunix_module().AttentionType.GLOBAL: "full_attention",
        }
        shape = hf.Gemma2Shape(
            hidden_size=config.embed_dim,
            intermediate_size=config.hidden_dim,
            num_layers=config.num_layers,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            sliding_window=config.sliding_window_size,
            vocab_size=config.num_embed,
            layer_types=tuple(layer_types[t] for t in config.attention_types),
            # Tunix scales queries by head_dim ** -0.5 in every Gemma 2 size
            query_pre_attn_scalar=config.head_dim,
            attn_logit_softcapping=config.attn_logits_soft_cap,
            final_logit_softcapping=config.final_logit_softcap,
            rope_theta=ROPE_THETA,
        )
        return hf.gemma2_config(shape)


def _check_gemma2(config: Any) -> None:
    if not (config.use_post_attn_norm and config.use_post_ffw_norm):
        raise InputError(
            "export supports Gemma 2 (post-attention and post-FFW norms); this Tunix "
            "gemma config has use_post_attn_norm="
            f"{config.use_post_attn_norm}, use_post_ffw_norm={config.use_post_ffw_norm}"
        )


FAMILY = Gemma2Family()
