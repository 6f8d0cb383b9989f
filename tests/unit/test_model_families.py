"""Qwen 3 and Llama 3 model specs and their checkpoints' RoPE (FAR beyond Gemma): a checkpoint
whose config.json asks for RoPE that Tunix 0.1.7's network does not apply (it uses its
apply_rope default base whatever the config says, and no scaling) is refused before it loads
and silently computes other logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.recipe import ModelSpec
from stages.core.errors import InputError
from stages.modeling import families, models


def _config_dir(tmp_path: Path, config: dict[str, object]) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize(
    "config",
    [
        # Llama 3.2 1B's published RoPE: base 500000, llama3 scaling
        {"rope_scaling": {"rope_type": "llama3", "factor": 32.0}, "rope_theta": 500000.0},
        # transformers 5's layout, another base (Qwen3-4B-2507)
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0}},
        {},  # no rope_theta at all: transformers' default base 10000
    ],
)
@pytest.mark.parametrize("family", families.FAMILIES)
def test_checkpoint_with_rope_tunix_does_not_apply_is_refused(
    tmp_path: Path, family: str, config: dict[str, object]
) -> None:
    with pytest.raises(InputError, match=r"config.json: rope_theta .* applies RoPE with base"):
        families.check_rope(family, _config_dir(tmp_path, config))


@pytest.mark.parametrize("family", families.FAMILIES)
def test_checkpoint_with_the_applied_rope_passes(tmp_path: Path, family: str) -> None:
    rope = {"rope_type": "default", "rope_theta": families.applied_rope_theta(family)}
    families.check_rope(family, _config_dir(tmp_path, {"rope_parameters": rope}))
    families.check_rope(family, _config_dir(tmp_path, {"rope_theta": 1_000_000}))


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
