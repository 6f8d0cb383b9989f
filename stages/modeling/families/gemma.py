"""What Gemma 2 and Gemma 3 share, as Tunix implements them (tunix.models.gemma, gemma3).

Both name their attention einsums q_einsum / kv_einsum / attn_vec_einsum (a fused qkv_einsum
when num_heads == num_kv_heads) and their MLPs gate_proj / up_proj / down_proj, and both map
them to the same Hugging Face tensor names, so one export of those tensors and Tunix's
Gemma 3 LoRA merge serve both.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from stages.core.errors import InputError
from stages.modeling.families.base import DEFAULT_LORA_TARGETS, ModelFamily, arr


def attention_tensors(attn: Any, config: Any) -> dict[str, np.ndarray]:
    """q/k/v/o projections of one Tunix Gemma attention block (same layout in Gemma 2 and 3)."""
    n, h, d, k = config.num_heads, config.head_dim, config.embed_dim, config.num_kv_heads
    if hasattr(attn, "qkv_einsum"):  # num_heads == num_kv_heads: fused (3, N, D, H)
        qkv = arr(attn.qkv_einsum.w)
        q, kv = qkv[0], qkv[1:]
    else:
        q = arr(attn.q_einsum.w)  # (N, D, H)
        kv = arr(attn.kv_einsum.w)  # (2, K, D, H)
    return {
        "self_attn.q_proj.weight": q.transpose(1, 0, 2).reshape(d, n * h).T,
        "self_attn.k_proj.weight": kv[0].transpose(1, 0, 2).reshape(d, k * h).T,
        "self_attn.v_proj.weight": kv[1].transpose(1, 0, 2).reshape(d, k * h).T,
        "self_attn.o_proj.weight": arr(attn.attn_vec_einsum.w).reshape(n * h, d).T,
    }


def mlp_tensors(mlp: Any) -> dict[str, np.ndarray]:
    return {
        "mlp.gate_proj.weight": arr(mlp.gate_proj.kernel).T,
        "mlp.up_proj.weight": arr(mlp.up_proj.kernel).T,
        "mlp.down_proj.weight": arr(mlp.down_proj.kernel).T,
    }


class GemmaFamily(ModelFamily):
    """Gemma 2 or 3: Gemma's projection names, `1 + scale` norms, Gemma's turn markers."""

    params_module = "params_safetensors"
    lora_targets = DEFAULT_LORA_TARGETS
    # the kv_einsum adapter is split into k and v (peft_export.lora_factors)
    lora_hf_modules: ClassVar[Mapping[str, str]] = {
        "attn.q_einsum": "self_attn.q_proj",
        "attn.k_einsum": "self_attn.k_proj",
        "attn.v_einsum": "self_attn.v_proj",
        "attn.attn_vec_einsum": "self_attn.o_proj",
        "mlp.gate_proj": "mlp.gate_proj",
        "mlp.up_proj": "mlp.up_proj",
        "mlp.down_proj": "mlp.down_proj",
    }
    end_of_turn = "<end_of_turn>"
    license = "gemma"  # the Gemma terms the base weights come under

    @abstractmethod
    def layer_tensors(self, layer: Any, config: Any) -> dict[str, np.ndarray]:
        """One layer's HF tensors (the inverse of Tunix's params_safetensors mapping)."""

    def hf_tensors(self, network: Any, config: Any) -> dict[str, np.ndarray]:
        out = {
            "model.embed_tokens.weight": arr(network.embedder.input_embedding),
            "model.norm.weight": arr(network.final_norm.scale),
        }
        for i, layer in enumerate(network.layers):
            tensors = self.layer_tensors(layer, config)
            out |= {f"model.layers.{i}.{name}": t for name, t in tensors.items()}
        return {name: np.ascontiguousarray(t) for name, t in out.items()}

    def merge_lora(self, base_dir: str, out_dir: str, policy: Any, rank: int, alpha: float) -> None:
        """Tunix's Gemma 3 merge, which also fits Gemma 2 (the same names, see above)."""
        from tunix.models.gemma3 import params as gemma3_params

        if hasattr(policy.layers[0].attn, "qkv_einsum"):
            raise InputError(
                "exporting LoRA on a fused-qkv model (num_heads == num_kv_heads) is not "
                "supported by Tunix's merge; Gemma 2 and 3 presets are not fused"
            )
        gemma3_params.save_lora_merged_model_as_safetensors(
            base_dir, out_dir, policy, rank=rank, alpha=alpha
        )
