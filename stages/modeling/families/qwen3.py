"""Qwen 3 (tunix.models.qwen3): a DecoderFamily with q/k norms and `use_tied_embedding`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from stages.modeling import hf_config as hf
from stages.modeling.families.base import arr
from stages.modeling.families.decoder import DecoderFamily


class Qwen3Family(DecoderFamily):
    name = "qwen3"
    tunix_package = "tunix.models.qwen3"
    network_class_name = "Qwen3"
    # only sizes whose published rope_theta is the base Tunix applies (applied_rope_theta)
    presets: ClassVar[Mapping[str, str]] = {"qwen3_0p6b": "qwen3_0p6b", "qwen3_1p7b": "qwen3_1p7b"}
    end_of_turn = "<|im_end|>"
    network_fields: ClassVar[Mapping[str, str]] = {
        **DecoderFamily.network_fields,
        "use_tied_embedding": "tie_word_embeddings",
    }

    def build_config(self, shapes: dict[str, Any], tie: bool, dtype: Any) -> Any:
        config_class = self.tunix_module().ModelConfig
        return config_class(**shapes, use_tied_embedding=tie, dtype=dtype, param_dtype=dtype)

    def preset_config(self, preset: str, dtype: Any) -> Any:
        """Qwen 3's preset configs are mutable dataclasses: the recipe's dtype is set."""
        config = super().preset_config(preset, dtype)
        config.dtype = config.param_dtype = dtype
        return config

    def tied(self, config: Any) -> bool:
        return bool(config.use_tied_embedding)

    def layer_tensors(self, layer: Any, config: Any) -> dict[str, np.ndarray]:
        return super().layer_tensors(layer, config) | {
            "self_attn.q_norm.weight": arr(layer.attn.q_norm.w),
            "self_attn.k_norm.weight": arr(layer.attn.k_norm.w),
        }

    def hf_config_of(self, shape: hf.DecoderShape) -> dict[str, Any]:
        return hf.qwen3_config(shape)


FAMILY = Qwen3Family()
