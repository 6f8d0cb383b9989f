"""Llama 3.x (tunix.models.llama3): a DecoderFamily with `weight_tying` and Llama 3's RoPE
scaling (rope_type 'llama3', applied by rope_adaptation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from stages.modeling import hf_config as hf
from stages.modeling.families.decoder import DecoderFamily


class Llama3Family(DecoderFamily):
    name = "llama3"
    tunix_package = "tunix.models.llama3"
    network_class_name = "Llama3"
    end_of_turn = "<|eot_id|>"
    network_fields: ClassVar[Mapping[str, str]] = {
        **DecoderFamily.network_fields,
        "weight_tying": "tie_word_embeddings",
    }
    rope_types = ("default", "llama3")

    def build_config(self, shapes: dict[str, Any], tie: bool, dtype: Any) -> Any:
        return self.tunix_module().ModelConfig(**shapes, weight_tying=tie)

    def tied(self, config: Any) -> bool:
        return bool(config.weight_tying)

    def hf_config_of(self, shape: hf.DecoderShape) -> dict[str, Any]:
        return hf.llama_config(shape)


FAMILY = Llama3Family()
