"""Qwen 3 and Llama 3: the per-family glue FAR needs around Tunix's own model code.

Gemma 2 and 3 grew up with FAR (models.py, hf_export.py); these two families come in through
Tunix's implementations (tunix.models.qwen3 / llama3, their params modules for checkpoints)
and differ from Gemma in every place FAR touches a network:
- module names: q_proj / k_proj / v_proj / o_proj projections (Gemma: q_einsum, kv_einsum,
  attn_vec_einsum), so LoRA's default targets are the family's own (`lora_module_path`);
- norms multiply by their weight (Gemma by 1 + weight), so a random-init network gets unit
  norm weights (`random_network`): Tunix's dummy creator draws every parameter from
  N(0, 0.02), which would scale every activation by ~0.02 and leave the tiny model untrainable;
- RoPE: Tunix 0.1.7 applies its `apply_rope` default base (1e6) in both families whatever
  the config's rope_theta says (and no scaling); rope_adaptation.py (installed when the
  family's module is first imported) makes the network rotate with the config's base and
  Llama 3 scaling, so a checkpoint's config.json (`checkpoint_config`) is what runs and what
  export writes; other RoPE types are refused (`check_rope`);
- Hugging Face names: Qwen3ForCausalLM and LlamaForCausalLM, written here (`hf_tensors`,
  `hf_config`); LoRA adapters are merged by Tunix's generic safetensors merge.
Tunix's Qwen3 and Llama3 rotate the two halves of each head (as transformers' rotate_half),
so exported q/k projections need no permutation and transformers loads them as they are.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models import safetensors_saver

from schemas.recipe import GEMMA_LORA_TARGETS, Architecture
from stages.core.errors import InputError
from stages.modeling import hf_config as hf
from stages.modeling import rope_adaptation

FAMILIES = ("qwen3", "llama3")
NORM_EPS = 1e-6
LORA_TARGETS = ".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*up_proj|.*down_proj"
# Tunix's module and network class of each family, imported at first use: Qwen 3's module
# pulls in the Pallas TPU kernels (0.5 s), which no Gemma run should pay for.
_NETWORKS = {"qwen3": ("tunix.models.qwen3", "Qwen3"), "llama3": ("tunix.models.llama3", "Llama3")}
# Only sizes whose published rope_theta is the base Tunix applies (see applied_rope_theta)
PRESETS = {"qwen3_0p6b": "qwen3", "qwen3_1p7b": "qwen3"}


def _module(family: str, part: str) -> Any:
    module = importlib.import_module(f"{_NETWORKS[family][0]}.{part}")
    rope_adaptation.install(importlib.import_module(f"{_NETWORKS[family][0]}.model"))
    return module


def modules(family: str) -> tuple[type[nnx.Module], Callable[..., nnx.Module]]:
    """The family's Tunix network class and its params module's safetensors loader."""
    network_class = getattr(_module(family, "model"), _NETWORKS[family][1])
    return network_class, _module(family, "params").create_model_from_safe_tensors


def _loaded(family: str) -> Any:
    """The family's Tunix model module if something imported it already, else None."""
    return sys.modules.get(f"{_NETWORKS[family][0]}.model")


def family_of(network: Any) -> str | None:
    """'qwen3' or 'llama3' for a Tunix network (or a LoRA clone of one), else None."""
    for family, (_, class_name) in _NETWORKS.items():
        module = _loaded(family)
        if module is not None and isinstance(network, getattr(module, class_name)):
            return family
    return None


def family_of_config(config: Any) -> str | None:
    """'qwen3' or 'llama3' for a Tunix ModelConfig of that family, else None."""
    for family in FAMILIES:
        module = _loaded(family)
        if module is not None and isinstance(config, module.ModelConfig):
            return family
    return None


def applied_rope_theta(family: str) -> float:
    """Tunix's own RoPE base for the family (its `apply_rope` default, which Tunix 0.1.7's
    attention applies whatever the config says): the tiny random networks keep it, so they
    compute what they computed before rope_adaptation."""
    apply_rope = inspect.unwrap(_module(family, "model").apply_rope)
    return float(inspect.signature(apply_rope).parameters["rope_theta"].default)


def tiny_config(family: str, arch: Architecture, dtype: Any) -> Any:
    """Tunix's ModelConfig for a random-init test network of `family` (tied embeddings)."""
    shapes = {
        "num_layers": arch.num_layers,
        "vocab_size": arch.num_embed,
        "embed_dim": arch.embed_dim,
        "hidden_dim": arch.hidden_dim,
        "num_heads": arch.num_heads,
        "head_dim": arch.head_dim,
        "num_kv_heads": arch.num_kv_heads,
        "rope_theta": int(applied_rope_theta(family)),
        "norm_eps": NORM_EPS,
    }
    config_class = _module(family, "model").ModelConfig
    if family == "qwen3":
        return config_class(**shapes, use_tied_embedding=True, dtype=dtype, param_dtype=dtype)
    return config_class(**shapes, weight_tying=True)


def preset_config(preset: str, dtype: Any) -> Any:
    """A published size's Tunix ModelConfig (Qwen 3's configs are mutable dataclasses)."""
    config = getattr(_module(PRESETS[preset], "model").ModelConfig, preset)()
    config.dtype = config.param_dtype = dtype
    return config


def random_network(network: nnx.Module) -> nnx.Module:
    """Set every RMSNorm weight of a dummy-initialised network to 1 (their real init).

    Qwen 3 and Llama 3 norms compute weight * x / rms(x); Tunix's dummy creator draws the
    weights from N(0, 0.02) like every other parameter."""
    family = family_of(network)
    if family is None:
        raise ValueError(f"{type(network).__name__} is neither a Tunix Qwen3 nor a Llama3")
    norm_class = _module(family, "model").RMSNorm
    for _, module in nnx.iter_graph(network):
        if isinstance(module, norm_class):
            module.w.set_value(jnp.ones_like(module.w.get_value()))
    return network


def lora_module_path(network: Any, module_path: str) -> str:
    """The LoRA target regex for `network`: the default (Gemma's projection names) means the
    family's own projections; any other regex is the recipe's, as written."""
    if module_path == GEMMA_LORA_TARGETS and family_of(network) is not None:
        return LORA_TARGETS
    return module_path


def _hf_rope(config: dict[str, Any]) -> tuple[float, str, dict[str, Any]]:
    """(base, rope type, the rope entry) of a transformers config.json (either layout)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = float(rope.get("rope_theta", config.get("rope_theta", 10_000.0)))
    return theta, str(rope.get("rope_type", rope.get("type", "default"))), rope


def read_hf_config(directory: str) -> dict[str, Any]:
    with open(os.path.join(directory, "config.json")) as f:
        found: dict[str, Any] = json.load(f)
    return found


def check_rope(family: str, directory: str) -> None:
    """Refuse a checkpoint whose config.json asks for a RoPE type FAR does not apply (only
    default and Llama 3's 'llama3' scaling run): it would load and compute wrong logits."""
    _, kind, _ = _hf_rope(read_hf_config(directory))
    if kind not in ("default", "llama3") or (kind == "llama3" and family != "llama3"):
        raise InputError(
            f"{os.path.join(directory, 'config.json')}: rope_type {kind!r}, but FAR's {family} "
            f"network applies default RoPE{' or llama3 scaling' if family == 'llama3' else ''}"
            f" (any rope_theta); use a checkpoint with one of those"
        )


def checkpoint_config(family: str, directory: str, dtype: Any) -> Any:
    """Tunix's ModelConfig for the checkpoint in `directory`, from its config.json: shapes,
    RoPE base and (Llama 3) scaling, norm epsilon, tied embeddings."""
    check_rope(family, directory)
    config = read_hf_config(directory)
    theta, kind, rope = _hf_rope(config)
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
    config_class = _module(family, "model").ModelConfig
    tie = bool(config.get("tie_word_embeddings", False))
    if family == "qwen3":
        built = config_class(**shapes, use_tied_embedding=tie, dtype=dtype, param_dtype=dtype)
    else:
        built = config_class(**shapes, weight_tying=tie)
    return rope_adaptation.scaled_config(built, rope) if kind == "llama3" else built


def _arr(param: Any) -> np.ndarray:
    return np.asarray(param.get_value(), dtype=np.float32)


def _layer_tensors(layer: Any, config: Any, family: str) -> dict[str, np.ndarray]:
    """One decoder layer as HF tensors: the inverse of Tunix's params key mapping."""
    attn, mlp = layer.attn, layer.mlp
    d, n, k, h = config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim
    out = {
        "self_attn.q_proj.weight": _arr(attn.q_proj.w).reshape(d, n * h).T,  # (D, N, H)
        "self_attn.k_proj.weight": _arr(attn.k_proj.w).reshape(d, k * h).T,
        "self_attn.v_proj.weight": _arr(attn.v_proj.w).reshape(d, k * h).T,
        "self_attn.o_proj.weight": _arr(attn.o_proj.w).reshape(n * h, d).T,  # (N, H, D)
        "mlp.gate_proj.weight": _arr(mlp.gate_proj.kernel).T,
        "mlp.up_proj.weight": _arr(mlp.up_proj.kernel).T,
        "mlp.down_proj.weight": _arr(mlp.down_proj.kernel).T,
        "input_layernorm.weight": _arr(layer.input_layernorm.w),
        "post_attention_layernorm.weight": _arr(layer.post_attention_layernorm.w),
    }
    if family == "qwen3":
        out["self_attn.q_norm.weight"] = _arr(attn.q_norm.w)
        out["self_attn.k_norm.weight"] = _arr(attn.k_norm.w)
    return out


def tied(config: Any) -> bool:
    """Whether the output projection is the embedding (the two families name it apart)."""
    if family_of_config(config) == "qwen3":
        return bool(config.use_tied_embedding)
    return bool(config.weight_tying)


def hf_tensors(network: Any, config: Any) -> dict[str, np.ndarray]:
    """Tunix Qwen3 / Llama3 parameters -> Qwen3ForCausalLM / LlamaForCausalLM tensors."""
    family = family_of(network)
    if family is None:
        raise ValueError(f"{type(network).__name__} is neither a Tunix Qwen3 nor a Llama3")
    out = {
        "model.embed_tokens.weight": _arr(network.embedder.input_embedding),
        "model.norm.weight": _arr(network.final_norm.w),
    }
    if not tied(config):
        out["lm_head.weight"] = _arr(network.lm_head.w).T  # (D, V)
    for i, layer in enumerate(network.layers):
        tensors = _layer_tensors(layer, config, family)
        out |= {f"model.layers.{i}.{name}": t for name, t in tensors.items()}
    return {name: np.ascontiguousarray(t) for name, t in out.items()}


def hf_config(config: Any) -> dict[str, Any]:
    """A transformers config (qwen3 or llama) for a Tunix Qwen3 / Llama3 ModelConfig."""
    family = family_of_config(config)
    if family is None:
        raise ValueError(f"{type(config).__name__} is neither a Qwen3 nor a Llama3 config")
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
        tie_word_embeddings=tied(config),
    )
    return hf.qwen3_config(shape) if family == "qwen3" else hf.llama_config(shape)


def _state_key(lora_path: str) -> str:
    """'layers.0.attn.q_proj' -> 'model.layers.0.self_attn.q_proj.weight' (both families)."""
    return f"model.{lora_path}.weight".replace(".attn.", ".self_attn.")


# Tunix's (in, out) adapter product -> the HF (out, in) weight, for every adapted projection
_TRANSPOSE = {
    name: (1, 0) for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj")
} | {"down_proj": (1, 0)}


def merge_lora(base_dir: str, out_dir: str, policy: Any, rank: int, alpha: float) -> None:
    """Write `base_dir`'s weights plus `policy`'s LoRA adapters to `out_dir` (Tunix's merge)."""
    safetensors_saver.save_lora_merged_model_as_safetensors(
        local_model_path=base_dir,
        output_dir=out_dir,
        lora_model=policy,
        rank=rank,
        alpha=alpha,
        state_key_transform_fn=_state_key,
        transpose_rules=_TRANSPOSE,
    )
