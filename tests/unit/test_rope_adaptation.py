"""FAR's RoPE adaptation of Tunix's Qwen 3 / Llama 3 networks (stages/modeling/rope_adaptation.py):
the Llama 3 frequencies are transformers' own, and the removal test that says when Tunix no
longer needs it."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from stages.modeling import families, rope_adaptation
from stages.modeling.families import decoder

# the families whose RoPE FAR adapts (Gemma 3's config.json: tests/unit/test_gemma3_config.py)
CONFIG_JSON_FAMILIES = [
    n for n, f in families.REGISTRY.items() if isinstance(f, decoder.DecoderFamily)
]

SCALING = {
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize("head_dim", [16, 64])
def test_llama3_frequencies_equal_transformers(head_dim: int) -> None:
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, **SCALING}
    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, rope_parameters=rope)
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    ours = rope_adaptation.llama3_inverse_frequencies(head_dim, 500000.0, SCALING)
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6)
    plain = rope_adaptation.llama3_inverse_frequencies(
        head_dim, 500000.0, SCALING | {"factor": 1.0}
    )
    assert not np.allclose(ours, plain)  # the scaling changes the long wavelengths


@pytest.mark.parametrize("family", CONFIG_JSON_FAMILIES)
def test_tunix_still_ignores_the_config_base(family: str) -> None:
    """Removal test: Tunix's attention block calls apply_rope without the config's base. When
    this fails, Tunix passes it itself and rope_adaptation's base handling can go."""
    module = families.get(family).tunix_module()
    source = inspect.getsource(module.Attention.block.__wrapped__)
    assert "rope_theta" not in source


@pytest.mark.parametrize("family", CONFIG_JSON_FAMILIES)
def test_adaptation_is_installed_once(family: str) -> None:
    module = families.get(family).tunix_module()
    block = module.Attention.block
    rope_adaptation.install(module)
    assert module.Attention.block is block and module._far_rope_adapted


@pytest.mark.parametrize("family", CONFIG_JSON_FAMILIES)
def test_tiny_networks_keep_tunix_base(family: str) -> None:
    """The random test networks' configs carry Tunix's own base, read through the adaptation."""
    from schemas.recipe import Architecture

    arch = Architecture(
        num_layers=1,
        num_embed=300,
        embed_dim=8,
        hidden_dim=8,
        num_heads=1,
        head_dim=8,
        num_kv_heads=1,
    )
    assert families.get(family).tiny_config(arch, np.float32).rope_theta == 1_000_000
