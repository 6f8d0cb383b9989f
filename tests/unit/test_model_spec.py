"""Model specs: sources, presets and tokenizers must agree; GGUF names map to HF names."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from pipeline.recipes import load_recipe
from schemas.recipe import ModelSpec
from stages.modeling.weight_sources import hf_name
from tests.conftest import REPO

TINY = {
    "num_layers": 2,
    "num_embed": 512,
    "embed_dim": 64,
    "hidden_dim": 128,
    "num_heads": 2,
    "head_dim": 32,
    "num_kv_heads": 1,
}

BAD_SPECS: list[tuple[dict[str, Any], str]] = [
    ({"source": "random"}, "exactly one of preset and architecture"),
    ({"source": "random", "preset": "gemma3_270m", "architecture": TINY}, "exactly one"),
    ({"source": "random", "preset": "gemma3_270m"}, "needs an explicit architecture"),
    ({"source": "gguf", "preset": "gemma3_270m"}, "expected tokenizer 'sentencepiece'"),
    ({"source": "safetensors", "preset": "gemma3_1b", "tokenizer": "sentencepiece"}, "needs a uri"),
    ({"source": "hub", "preset": "gemma3_1b", "tokenizer": "sentencepiece"}, "needs a uri"),
    ({"source": "random", "architecture": TINY, "uri": "x"}, "takes no uri"),
    (
        {"family": "gemma2", "source": "gguf", "preset": "gemma2_2b", "tokenizer": "sentencepiece"},
        "supports family 'gemma3' only",
    ),
    (
        {
            "family": "gemma3",
            "source": "hub",
            "uri": "google/gemma-2-2b-it",
            "preset": "gemma2_2b",
            "tokenizer": "sentencepiece",
        },
        "is not a 'gemma3' model",
    ),
    ({"source": "random", "architecture": {**TINY, "num_embed": 100}}, "num_embed must be >= 272"),
    # only Gemma 3 / Qwen 3 / Llama 3 checkpoints are described by their config.json
    (
        {"family": "gemma2", "source": "safetensors", "uri": "/m", "tokenizer": "sentencepiece"},
        "exactly one",
    ),
    ({"family": "qwen3", "source": "random"}, "exactly one of preset and architecture"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_SPECS)
def test_inconsistent_specs_are_rejected(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ModelSpec.model_validate(fields)


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
@pytest.mark.parametrize("source", ["safetensors", "hub"])
def test_qwen3_and_llama3_checkpoints_need_no_preset(family: str, source: str) -> None:
    spec = ModelSpec.model_validate(
        {"family": family, "source": source, "uri": "org/name", "tokenizer": "sentencepiece"}
    )
    assert spec.preset is None and spec.architecture is None
    assert "preset" not in spec.model_dump(exclude_defaults=True)


def test_good_specs() -> None:
    ModelSpec(source="gguf", preset="gemma3_270m", tokenizer="sentencepiece")
    ModelSpec(
        source="hub", uri="google/gemma-3-1b-it", preset="gemma3_1b", tokenizer="sentencepiece"
    )
    ModelSpec.model_validate({"family": "gemma2", "architecture": TINY})


@pytest.mark.parametrize(
    ("gguf", "hf"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("blk.17.attn_output.weight", "model.layers.17.self_attn.o_proj.weight"),
        ("blk.3.attn_k_norm.weight", "model.layers.3.self_attn.k_norm.weight"),
        ("blk.3.ffn_norm.weight", "model.layers.3.pre_feedforward_layernorm.weight"),
        ("blk.3.post_ffw_norm.weight", "model.layers.3.post_feedforward_layernorm.weight"),
        ("blk.3.post_attention_norm.weight", "model.layers.3.post_attention_layernorm.weight"),
        ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
    ],
)
def test_gguf_names(gguf: str, hf: str) -> None:
    assert hf_name(gguf) == hf


def test_unknown_gguf_tensor_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"blk.0.attn_qkv.weight"):
        hf_name("blk.0.attn_qkv.weight")


def test_tpu_recipes_follow_seed_000() -> None:
    """Not runnable here (no TPU): their shapes are checked instead."""
    for name in ("tpu-gemma3-1b-v5e8.yaml", "kaggle-gemma2-2b-v5e8.yaml"):
        recipe = load_recipe(str(REPO / "recipes" / name))
        assert recipe.model.dtype == "bfloat16"
        assert recipe.mesh.fsdp * recipe.mesh.tp == 8  # a v5e-8
        assert recipe.sft.batch_size == 2 * 8  # 2 per chip
        assert recipe.sft.batch_size * recipe.sft.gradient_accumulation_steps == 128
        assert recipe.data.max_seq_len == 1024
        assert recipe.session_budget is not None
        assert recipe.session_budget.total_seconds() <= 9 * 3600  # a Kaggle session
