"""What Qwen 3 and Llama 3 share, as Tunix implements them (tunix.models.qwen3 / llama3).

They differ from Gemma in every place FAR touches a network:
- module names: q_proj / k_proj / v_proj / o_proj projections (Gemma: q_einsum, kv_einsum,
  attn_vec_einsum), so LoRA's default targets are the family's own;
- norms multiply by their weight (Gemma by 1 + weight), so a random-init network gets unit
  norm weights (`init_random`): Tunix's dummy creator draws every parameter from
  N(0, 0.02), which would scale every activation by ~0.02 and leave the tiny model untrainable;
- RoPE: Tunix 0.1.7 applies its `apply_rope` default base (1e6) in both families whatever
  the config's rope_theta says (and no scaling); rope_adaptation.py (installed when the
  family's module is first imported, `prepare`) makes the network rotate with the config's
  base and Llama 3 scaling, so a checkpoint's config.json (`checkpoint_config`) is what runs
  and what export writes; other RoPE types are refused (`check_checkpoint`);
- Hugging Face names: Qwen3ForCausalLM and LlamaForCausalLM, written here (`hf_tensors`,
  `hf_config`); LoRA adapters are merged by Tunix's generic safetensors merge.
Tunix's Qwen3 and Llama3 rotate the two halves of each head (as transformers' rotate_half),
so exported q/k projections need no permutation and transformers loads them as they are.
"""

from __future__ import annotations

import inspect
import json
import os
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from schemas.recipe import Architecture
from stages.core.errors import InputError
from stages.modeling import hf_config as hf
from stages.modeling.families.base import ModelFamily, arr

NORM_EPS = 1e-6
LORA_TARGETS = ".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*up_proj|.*down_proj"
# q: (D, N, H) and o: (N, H, D) kernels, flattened as the weight export flattens them; the
# MLPs are named as Hugging Face names them
HF_MODULES = {f"attn.{p}_proj": f"self_attn.{p}_proj" for p in "qkvo"} | {
    f"mlp.{p}_proj": f"mlp.{p}_proj" for p in ("gate", "up", "down")
}
# Tunix's (in, out) adapter product -> the HF (out, in) weight, for every adapted projection
_TRANSPOSE = {name.split(".")[-1]: (1, 0) for name in HF_MODULES}


def hf_rope(config: dict[str, Any]) -> tuple[float, str, dict[str, Any]]:
    """(base, rope type, the rope entry) of a transformers config.json (either layout)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = float(rope.get("rope_theta", config.get("rope_theta", 10_000.0)))
    return theta, str(rope.get("rope_type", rope.get("type", "default"))), rope


def read_hf_config(directory: str) -> dict[str, Any]:
    with open(os.path.join(directory, "config.json")) as f:
        found: dict[str, Any] = json.load(f)
    return found


def _state_key(lora_path: str) -> str:
    """'layers.0.attn.q_proj' -> 'model.layers.0.self_attn.q_proj.weight' (both families)."""
    return f"model.{lora_path}.weight".replace(".attn.", ".self_attn.")


class DecoderFamily(ModelFamily):
    """A Tunix Qwen 3 / Llama 3-style decoder: global attention, SiLU MLP, HF-named modules."""

    params_module = "params"
    lora_targets = LORA_TARGETS
    lora_hf_modules = HF_MODULES
    reads_config_json = True
    network_fields: ClassVar[Mapping[str, str]] = {
        "num_layers": "num_hidden_layers",
        "vocab_size": "vocab_size",
        "embed_dim": "hidden_size",
        "hidden_dim": "intermediate_size",
        "num_heads": "num_attention_heads",
        "head_dim": "head_dim",
        "num_kv_heads": "num_key_value_heads",
        "rope_theta": "rope_theta",
        "rope_scaling": "the llama3 rope_scaling",
        "norm_eps": "rms_norm_eps",
    }
    rope_types: ClassVar[tuple[str, ...]] = ("default",)
    """The config.json rope types the adapted network applies (any rope_theta)."""

    @abstractmethod
    def build_config(self, shapes: dict[str, Any], tie: bool, dtype: Any) -> Any:
        """Tunix's ModelConfig from the shared shape fields (each family names tying apart)."""

    @abstractmethod
    def tied(self, config: Any) -> bool:
        """Whether the output projection is the embedding."""

    @abstractmethod
    def hf_config_of(self, shape: hf.DecoderShape) -> dict[str, Any]:
        """The transformers config.json of `shape` (qwen3 or llama)."""

    def prepare(self, model_module: Any) -> None:
        from stages.modeling import rope_adaptation  # deferred: imports JAX

        rope_adaptation.install(model_module)

    def applied_rope_theta(self) -> float:
        """Tunix's own RoPE base (its `apply_rope` default, which Tunix 0.1.7's attention
        applies whatever the config says): the tiny random networks keep it, so they compute
        what they computed before rope_adaptation."""
        apply_rope = inspect.unwrap(self.tunix_module().apply_rope)
        return float(inspect.signature(apply_rope).parameters["rope_theta"].default)

    def tiny_config(self, arch: Architecture, dtype: Any) -> Any:
        """A random-init test network (tied embeddings)."""
        shapes = {
            "num_layers": arch.num_layers,
            "vocab_size": arch.num_embed,
            "embed_dim": arch.embed_dim,
            "hidden_dim": arch.hidden_dim,
            "num_heads": arch.num_heads,
            "head_dim": arch.head_dim,
            "num_kv_heads": arch.num_kv_heads,
            "rope_theta": int(self.applied_rope_theta()),
            "norm_eps": NORM_EPS,
        }
        return self.build_config(shapes, True, dtype)

    def check_checkpoint(self, directory: str) -> None:
        """Refuse a checkpoint whose config.json asks for a RoPE type FAR does not apply: it
        would load and compute wrong logits."""
        _, kind, _ = hf_rope(read_hf_config(directory))
        if kind not in self.rope_types:
            scaled = " or llama3 scaling" if "llama3" in self.rope_types else ""
            raise InputError(
                f"{os.path.join(directory, 'config.json')}: rope_type {kind!r}, but FAR's "
                f"{self.name} network applies default RoPE{scaled} (any rope_theta); use a "
                f"checkpoint with one of those"
            )

    def checkpoint_config(self, directory: str, dtype: Any) -> Any:
        """Shapes, RoPE base and (Llama 3) scaling, norm epsilon, tied embeddings."""
        from stages.modeling import rope_adaptation

        self.check_checkpoint(directory)
        config = read_hf_config(directory)
        theta, kind, rope = hf_rope(config)
        heads = int(config["num_attention_heads"])
        shapes = {
            "num_layers": int(config["num_hidden_layers"]),
            "vocab_size": int(config["vocab_size"]),
            "embed_dim": int(config["hidden_size"]),
            "hidden_dim": int(config["intermediate_size"]),
            "num_heads": heads,
            "head_dim": int(config.get("head_dim") or config["hidden_size"] // heads),
            "num_kv_heads": int(config.get("num_key_value_heads") or heads),
            "rope_theta": int(theta) if theta.is_integer() else theta,
            "norm_eps": float(config.get("rms_norm_eps", NORM_EPS)),
        }
        built = self.build_config(shapes, bool(config.get("tie_word_embeddings", False)), dtype)
        return rope_adaptation.scaled_config(built, rope) if kind == "llama3" else built

    def init_random(self, network: Any) -> Any:
        """Every RMSNorm weight to 1 (their real init): these norms compute weight * x / rms(x)."""
        import jax.numpy as jnp
        from flax import nnx

        norm_class = self.tunix_module().RMSNorm
        for _, module in nnx.iter_graph(network):
            if isinstance(module, norm_class):
                module.w.set_value(jnp.ones_like(module.w.get_value()))
        return network

    def layer_tensors(self, layer: Any, config: Any) -> dict[str, np.ndarray]:
        """One decoder layer as HF tensors: the inverse of Tunix's params key mapping."""
        attn, mlp = layer.attn, layer.mlp
        d, n, k, h = config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim
        return {
            "self_attn.q_proj.weight": arr(attn.q_proj.w).reshape(d, n * h).T,  # (D, N, H)
            "self_attn.k_proj.weight": arr(attn.k_proj.w).reshape(d, k * h).T,
            "self_attn.v_proj.weight": arr(attn.v_proj.w).reshape(d, k * h).T,
            "self_attn.o_proj.weight": arr(attn.o_proj.w).reshape(n * h, d).T,  # (N, H, D)
            "mlp.gate_proj.weight": arr(mlp.gate_proj.kernel).T,
            "mlp.up_proj.weight": arr(mlp.up_proj.kernel).T,
            "mlp.down_proj.weight": arr(mlp.down_proj.kernel).T,
            "input_layernorm.weight": arr(layer.input_layernorm.w),
            "post_attention_layernorm.weight": arr(layer.post_attention_layernorm.w),
        }

    def hf_tensors(self, network: Any, config: Any) -> dict[str, np.ndarray]:
        out = {
            "model.embed_tokens.weight": arr(network.embedder.input_embedding),
            "model.norm.weight": arr(network.final_norm.w),
        }
        if not self.tied(config):
            out["lm_head.weight"] = arr(network.lm_head.w).T  # (D, V)
        for i, layer in enumerate(network.layers):
            tensors = self.layer_tensors(layer, config)
            out |= {f"model.layers.{i}.{name}": t for name, t in tensors.items()}
        return {name: np.ascontiguousarray(t) for name, t in out.items()}

    def hf_config(self, config: Any) -> dict[str, Any]:
        from stages.modeling import rope_adaptation

        shape = hf.DecoderShape(
            hidden_size=config.embed_dim,
            intermediate_size=config.hidden_dim,
            num_layers=config.num_layers,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            vocab_size=config.vocab_size,
            rope_theta=float(config.rope_theta),
            rope_scaling=rope_adaptation.rope_scaling(config),
            rms_norm_eps=config.norm_eps,
            tie_word_embeddings=self.tied(config),
        )
        return self.hf_config_of(shape)

    def merge_lora(self, base_dir: str, out_dir: str, policy: Any, rank: int, alpha: float) -> None:
        """Tunix's generic safetensors merge, with the HF names and transposes above."""
        from tunix.models import safetensors_saver

        safetensors_saver.save_lora_merged_model_as_safetensors(
            local_model_path=base_dir,
            output_dir=out_dir,
            lora_model=policy,
            rank=rank,
            alpha=alpha,
            state_key_transform_fn=_state_key,
            transpose_rules=_TRANSPOSE,
        )
