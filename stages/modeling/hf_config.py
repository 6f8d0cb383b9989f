"""The Hugging Face `config.json` of the model families FAR exports, in one place.

Two paths write Hugging Face directories: converting the packaged GGUF file into safetensors
(weight_sources) and exporting a trained checkpoint (export). Both describe the same
architecture to transformers, so the dictionary is built here from the numbers each one has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GLOBAL_ATTENTION_EVERY = 6  # Gemma 3: five sliding-window layers, then one global layer


@dataclass(frozen=True)
class Gemma3TextShape:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int
    vocab_size: int
    full_rope: dict[str, Any]
    sliding_rope: dict[str, Any]
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    bos_token_id: int = 2
    eos_token_id: int = 1
    pad_token_id: int = 0
    query_pre_attn_scalar: int | None = None
    """Queries are scaled by this ** -0.5; None: head_dim (Gemma 3 up to 12B; 27B uses
    hidden_size // num_heads)."""


def rope(theta: float, factor: float = 1.0) -> dict[str, Any]:
    """A transformers rope_parameters entry: default, or linear scaling by `factor`."""
    if factor == 1.0:
        return {"rope_type": "default", "rope_theta": float(theta)}
    return {"rope_type": "linear", "rope_theta": float(theta), "factor": float(factor)}


def gemma3_layer_types(num_layers: int, every: int = GLOBAL_ATTENTION_EVERY) -> list[str]:
    """Gemma 3's attention type per layer: a full-attention layer after each `every - 1`
    sliding-window ones (Tunix's network computes the default pattern only)."""
    return [
        "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(num_layers)
    ]


def gemma3_text_config(shape: Gemma3TextShape) -> dict[str, Any]:
    """A transformers Gemma3ForCausalLM (model_type gemma3_text) config, f32 weights."""
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "query_pre_attn_scalar": shape.query_pre_attn_scalar or shape.head_dim,
        "sliding_window": shape.sliding_window,
        "layer_types": gemma3_layer_types(shape.num_layers),
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_parameters": {
            "full_attention": shape.full_rope,
            "sliding_attention": shape.sliding_rope,
        },
        "hidden_activation": "gelu_pytorch_tanh",
        "vocab_size": shape.vocab_size,
        "bos_token_id": shape.bos_token_id,
        "eos_token_id": shape.eos_token_id,
        "pad_token_id": shape.pad_token_id,
        "tie_word_embeddings": True,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "torch_dtype": "float32",
    }


@dataclass(frozen=True)
class Gemma2Shape:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None
    vocab_size: int
    layer_types: tuple[str, ...]  # "sliding_attention" or "full_attention", one per layer
    query_pre_attn_scalar: int
    attn_logit_softcapping: float | None
    final_logit_softcapping: float | None
    rope_theta: float = 10_000.0
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    bos_token_id: int = 2
    eos_token_id: int = 1
    pad_token_id: int = 0


def gemma2_config(shape: Gemma2Shape) -> dict[str, Any]:
    """A transformers Gemma2ForCausalLM (model_type gemma2) config, f32 weights."""
    if len(shape.layer_types) != shape.num_layers:
        raise ValueError(
            f"gemma2 config: {len(shape.layer_types)} layer types for "
            f"{shape.num_layers} layers; expected one per layer"
        )
    return {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "query_pre_attn_scalar": shape.query_pre_attn_scalar,
        "sliding_window": shape.sliding_window,
        "layer_types": list(shape.layer_types),
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_parameters": rope(shape.rope_theta),
        "hidden_activation": "gelu_pytorch_tanh",
        "vocab_size": shape.vocab_size,
        "bos_token_id": shape.bos_token_id,
        "eos_token_id": shape.eos_token_id,
        "pad_token_id": shape.pad_token_id,
        "tie_word_embeddings": True,
        "final_logit_softcapping": shape.final_logit_softcapping,
        "attn_logit_softcapping": shape.attn_logit_softcapping,
        "torch_dtype": "float32",
    }


@dataclass(frozen=True)
class DecoderShape:
    """A Qwen 3 or Llama 3 decoder: every layer global attention, SiLU-gated MLP."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope_scaling: dict[str, float] | None = None  # Llama 3's 'llama3' frequency scaling
    max_position_embeddings: int = 32768
    # FAR's byte tokenizer's ids (stages/modeling/tokenizers.py): <pad> 0, <eos> 1, <bos> 2
    bos_token_id: int = 2
    eos_token_id: int = 1
    pad_token_id: int = 0


def _decoder_config(shape: DecoderShape) -> dict[str, Any]:
    return {
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_parameters": (
            {"rope_type": "llama3", "rope_theta": float(shape.rope_theta), **shape.rope_scaling}
            if shape.rope_scaling
            else rope(shape.rope_theta)
        ),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "vocab_size": shape.vocab_size,
        "bos_token_id": shape.bos_token_id,
        "eos_token_id": shape.eos_token_id,
        "pad_token_id": shape.pad_token_id,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "torch_dtype": "float32",
    }


def qwen3_config(shape: DecoderShape) -> dict[str, Any]:
    """A transformers Qwen3ForCausalLM (model_type qwen3) config, f32 weights."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **_decoder_config(shape),
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": shape.num_layers,
        "layer_types": ["full_attention"] * shape.num_layers,
    }


def llama_config(shape: DecoderShape) -> dict[str, Any]:
    """A transformers LlamaForCausalLM (model_type llama) config, f32 weights."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_decoder_config(shape),
        "mlp_bias": False,
        "pretraining_tp": 1,
    }
