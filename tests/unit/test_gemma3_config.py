"""A Gemma 3 checkpoint's config.json describes its network: both RoPE bases and their linear
scaling, the window and the shapes are read from it, in either layout transformers writes; a
preset or architecture that disagrees with it, and a config.json asking for what Tunix's
network does not compute, are refused before any weight is read (both would otherwise load
and silently compute other logits than transformers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from schemas.recipe import Architecture, MeshSpec, ModelSpec
from stages.core.errors import InputError
from stages.modeling import families, models
from stages.modeling import hf_config as hf

ARCH = Architecture(
    num_layers=6,
    num_embed=300,
    embed_dim=64,
    hidden_dim=128,
    num_heads=4,
    head_dim=16,
    num_kv_heads=2,
    sliding_window_size=8,
)


def _config(full_theta: float = 1_000_000.0, **changes: Any) -> dict[str, Any]:
    """A transformers 5 Gemma3ForCausalLM config.json of ARCH's shapes."""
    shape = hf.Gemma3TextShape(
        hidden_size=64,
        intermediate_size=128,
        num_layers=6,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        sliding_window=8,
        vocab_size=300,
        full_rope=hf.rope(full_theta),
        sliding_rope=hf.rope(10_000.0),
    )
    return hf.gemma3_text_config(shape) | changes


def _checkpoint(tmp_path: Path, config: dict[str, Any]) -> Path:
    """An HF-layout directory whose weights file is empty: loading it would fail, so a refusal
    raised by build_base_model came before any weight was read."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_text("{}")
    return tmp_path


def _spec(directory: Path, **given: Any) -> ModelSpec:
    return ModelSpec(
        family="gemma3",
        source="safetensors",
        uri=str(directory),
        tokenizer="sentencepiece",
        **given,
    )


def _build(spec: ModelSpec, tmp_path: Path) -> None:
    models.build_base_model(spec, models.build_mesh(MeshSpec()), str(tmp_path / "cache"))


def test_a_checkpoint_needs_no_preset_or_architecture(tmp_path: Path) -> None:
    spec = _spec(_checkpoint(tmp_path, _config()))
    config = models.tunix_config(spec)
    assert (config.global_base_frequency, config.local_base_frequency) == (1_000_000, 10_000)
    assert (config.num_layers, config.num_embed, config.sliding_window_size) == (6, 300, 8)


def test_an_architecture_disagreeing_with_config_json_is_refused_before_loading(
    tmp_path: Path,
) -> None:
    """The architecture block cannot set RoPE bases: its network rotates with Tunix's 1e4."""
    spec = _spec(_checkpoint(tmp_path, _config()), architecture=ARCH)
    with pytest.raises(InputError) as refused:
        _build(spec, tmp_path)
    message = str(refused.value)
    assert "global_base_frequency is 10000 in model.architecture, 1000000 in config.json" in (
        message
    )
    assert "Remove model.preset and model.architecture" in message
    assert "local_base_frequency" not in message  # both say 1e4: only what differs is named


def test_a_preset_disagreeing_with_config_json_is_refused(tmp_path: Path) -> None:
    spec = _spec(_checkpoint(tmp_path, _config()), preset="gemma3_270m")
    with pytest.raises(InputError, match=r"model.preset 'gemma3_270m' disagrees") as refused:
        _build(spec, tmp_path)
    assert "num_layers is 18 in model.preset 'gemma3_270m', 6 in config.json" in str(refused.value)


def test_an_architecture_agreeing_with_config_json_passes(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path, _config(full_theta=10_000.0))
    family = families.get("gemma3")
    family.check_given_config(family.tiny_config(ARCH, np.float32), str(directory), "arch")


def test_the_older_config_json_layout_is_read(tmp_path: Path) -> None:
    """transformers 4's keys, as google/gemma-3-4b-it's text_config has them (linear scaling
    by 8 on full attention only), nested under a multimodal config."""
    text = {k: v for k, v in _config().items() if k not in ("rope_parameters", "layer_types")} | {
        "rope_theta": 1_000_000,
        "rope_local_base_freq": 10_000,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window_pattern": 6,
    }
    directory = _checkpoint(tmp_path, {"model_type": "gemma3", "text_config": text})
    config = families.get("gemma3").checkpoint_config(str(directory), np.float32)
    assert (config.global_base_frequency, config.global_scale_factor) == (1_000_000, 8.0)
    assert (config.local_base_frequency, config.local_scale_factor) == (10_000, 1.0)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"rms_norm_eps": 1e-5}, "rms_norm_eps is 1e-05"),
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping is 30.0"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings is False"),
        ({"layer_types": ["full_attention"] * 6}, "layer_types is"),
        ({"query_pre_attn_scalar": 20}, "query_pre_attn_scalar is 20"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6}}},
            "full-attention RoPE is rope_type 'yarn'",
        ),
    ],
)
def test_what_tunix_hard_codes_is_refused_when_config_json_asks_otherwise(
    tmp_path: Path, changes: dict[str, Any], named: str
) -> None:
    spec = _spec(_checkpoint(tmp_path, _config(**changes)))
    with pytest.raises(InputError, match="Tunix's Gemma 3 network computes") as refused:
        _build(spec, tmp_path)
    assert named in str(refused.value)


def test_a_gguf_files_float32_epsilon_passes(tmp_path: Path) -> None:
    """The GGUF conversion writes the epsilon it stores as float32 (9.99999997e-07)."""
    directory = _checkpoint(tmp_path, _config(rms_norm_eps=float(np.float32(1e-6))))
    families.get("gemma3").check_checkpoint(str(directory))


@pytest.mark.parametrize("scalar", [16, 16 * 2])  # head_dim (up to 12B), hidden // heads (27B)
def test_the_exported_config_json_keeps_the_query_scaling_the_checkpoint_had(
    tmp_path: Path, scalar: int
) -> None:
    """Gemma 3 27B scales queries by (hidden_size // heads) ** -0.5, not head_dim ** -0.5:
    an export that wrote head_dim back would load in transformers with other logits."""
    config = _config(hidden_size=128, query_pre_attn_scalar=scalar)
    directory = _checkpoint(tmp_path, config)
    family = families.get("gemma3")
    tunix_config = family.checkpoint_config(str(directory), np.float32)
    assert family.hf_config(tunix_config)["query_pre_attn_scalar"] == scalar
