"""Qwen 3 and Llama 3 model specs and their checkpoints' RoPE (FAR beyond Gemma): any base and
Llama 3's scaling run (rope_adaptation.py); a checkpoint whose config.json asks for another
RoPE type is refused before it loads and silently computes other logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.recipe import ModelSpec
from stages.core.errors import InputError
from stages.modeling import families, models
from stages.modeling.families import decoder

# the families whose RoPE FAR adapts (Gemma 3's config.json: tests/unit/test_gemma3_config.py)
CONFIG_JSON_FAMILIES = [
    n for n, f in families.REGISTRY.items() if isinstance(f, decoder.DecoderFamily)
]


def _config_dir(tmp_path: Path, config: dict[str, object]) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize(
    "config",
    [
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "rope_theta": 500000.0},
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
    ],
)
@pytest.mark.parametrize("family", CONFIG_JSON_FAMILIES)
def test_checkpoint_with_rope_far_does_not_apply_is_refused(
    tmp_path: Path, family: str, config: dict[str, object]
) -> None:
    with pytest.raises(InputError, match=r"config.json: rope_type .* applies default RoPE"):
        families.get(family).check_checkpoint(_config_dir(tmp_path, config))


@pytest.mark.parametrize(
    "config",
    [
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0}},  # Qwen3-4B-2507
        {"rope_theta": 1_000_000},
        {},  # no rope_theta at all: transformers' default base 10000
    ],
)
@pytest.mark.parametrize("family", CONFIG_JSON_FAMILIES)
def test_checkpoint_with_any_base_passes(
    tmp_path: Path, family: str, config: dict[str, object]
) -> None:
    families.get(family).check_checkpoint(_config_dir(tmp_path, config))


def test_llama3_scaling_passes_for_llama_only(tmp_path: Path) -> None:
    """Llama 3.2 1B's published RoPE: base 500000, llama3 scaling."""
    config = {"rope_scaling": {"rope_type": "llama3", "factor": 32.0}, "rope_theta": 500000.0}
    families.get("llama3").check_checkpoint(_config_dir(tmp_path, config))
    with pytest.raises(InputError, match="rope_type 'llama3'"):
        families.get("qwen3").check_checkpoint(_config_dir(tmp_path, config))


def test_qwen3_presets_are_the_published_sizes() -> None:
    spec = ModelSpec(
        family="qwen3",
        source="hub",
        uri="Qwen/Qwen3-0.6B",
        preset="qwen3_0p6b",
        tokenizer="sentencepiece",
    )
    config = models.tunix_config(spec)
    assert (config.num_layers, config.embed_dim, config.vocab_size) == (28, 1024, 151936)
    with pytest.raises(ValidationError, match="preset 'qwen3_0p6b' is not a 'llama3' model"):
        ModelSpec(
            family="llama3",
            source="hub",
            uri="x/y",
            preset="qwen3_0p6b",
            tokenizer="sentencepiece",
        )


@pytest.mark.parametrize("family", CONFIG_JSON_FAMILIES)
def test_an_architecture_disagreeing_with_config_json_is_refused(
    tmp_path: Path, family: str
) -> None:
    """An architecture block's network rotates with Tunix's base (1e6): beside a checkpoint
    whose config.json says 5e6 it would load and compute other logits, silently."""
    from schemas.recipe import Architecture

    arch = Architecture(
        num_layers=2,
        num_embed=300,
        embed_dim=64,
        hidden_dim=128,
        num_heads=4,
        head_dim=16,
        num_kv_heads=2,
    )
    shapes = {
        "num_hidden_layers": 2,
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "head_dim": 16,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    }
    given = families.get(family).tiny_config(arch, None)
    agreeing = tmp_path / "agreeing"
    agreeing.mkdir()
    families.get(family).check_given_config(
        given, _config_dir(agreeing, shapes | {"rope_theta": 1_000_000}), "model.architecture"
    )
    with pytest.raises(InputError, match=r"rope_theta is 1000000 in model.architecture, 5000000"):
        families.get(family).check_given_config(
            given, _config_dir(tmp_path, shapes | {"rope_theta": 5_000_000}), "model.architecture"
        )
