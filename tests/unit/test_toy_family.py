"""Adding a model family (docs/adding-a-model-family.md) touches no code outside its module:
a toy family, a renamed copy of the Llama 3 module registered at test time (the registry file
unchanged), builds its config, runs a forward pass, exports its weights and config.json under
Hugging Face names and loads them back to the same parameters and logits, names its LoRA
adapters for peft and lends its end-of-turn token to the tokenizers.

The schema's `Family` literal lists the shipped families only (test_family_dispatch checks it
is the registry), so the toy's ModelSpec is copied from a valid one with the family renamed."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from schemas.recipe import Architecture, LoraSpec, MeshSpec, ModelSpec
from stages.modeling import families, hf_export, models, peft_export, tokenizers

LLAMA3_MODULE = Path(families.__file__).parent / "llama3.py"
ARCH = Architecture(
    num_layers=2,
    num_embed=300,
    embed_dim=16,
    hidden_dim=32,
    num_heads=2,
    head_dim=8,
    num_kv_heads=1,
)
IDS = [2, 40, 41, 42, 43, 44]


def _copied_module(name: str) -> Any:
    """A fresh copy of the Llama 3 family's module: its own classes, nothing shared."""
    spec = importlib.util.spec_from_file_location(name, LLAMA3_MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def toy() -> Iterator[families.ModelFamily]:
    module = _copied_module("toy_family_module")

    class ToyFamily(module.Llama3Family):  # type: ignore[misc,name-defined]
        name = "toy3"
        end_of_turn = "<|toy_end|>"

    family = ToyFamily()
    families.register(family)
    try:
        yield family
    finally:
        del families.REGISTRY[family.name]


def _toy_spec() -> ModelSpec:
    return ModelSpec(family="llama3", architecture=ARCH).model_copy(update={"family": "toy3"})


def _logits(network: Any) -> np.ndarray:
    n = len(IDS)
    mask = np.tril(np.ones((1, n, n), dtype=bool))
    logits, _ = network(np.asarray([IDS]), np.arange(n)[None], None, mask)
    return np.asarray(logits[0], dtype=np.float32)


def _params(network: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(network, nnx.Param))]


def test_registering_a_family_makes_every_dispatch_site_reach_it(
    toy: families.ModelFamily, tmp_path: Path
) -> None:
    assert families.get("toy3") is toy
    with pytest.raises(ValueError, match="registered already"):
        families.register(type(toy)())
    spec = _toy_spec()
    config = models.tunix_config(spec)
    assert (config.num_layers, config.embed_dim, config.vocab_size) == (2, 16, 300)

    mesh = models.build_mesh(MeshSpec())
    network = models.build_base_model(spec, mesh, str(tmp_path))
    with mesh:
        before = _logits(network)
    assert np.isfinite(before).all() and np.abs(before).max() > 0

    export = tmp_path / "export"
    export.mkdir()
    hf_export._write_hf_dir(network, spec, str(export))
    written = json.loads((export / "config.json").read_text())
    assert (written["hidden_size"], written["num_hidden_layers"]) == (16, 2)
    assert toy.checkpoint_config(str(export), np.float32) == config  # config.json both ways

    _, load = toy.network_modules()
    with mesh:
        reloaded = load(str(export), config, mesh=mesh)
        after = _logits(reloaded)
    for ours, back in zip(_params(network), _params(reloaded), strict=True):
        np.testing.assert_array_equal(ours, back)  # weight names both ways
    np.testing.assert_allclose(after, before, atol=1e-6, rtol=0)


def test_a_registered_family_names_its_adapters_and_end_of_turn(
    toy: families.ModelFamily, tmp_path: Path
) -> None:
    mesh = models.build_mesh(MeshSpec())
    network = models.build_base_model(_toy_spec(), mesh, str(tmp_path))
    policy = models.apply_lora(network, LoraSpec(rank=2), mesh)  # the default targets
    tensors = peft_export.adapter_tensors(policy, toy.lora_hf_modules)
    modules = {name.split(".")[-3] for name in tensors}
    assert modules == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert tokenizers.end_of_turn_markers()[-1] == "<|toy_end|>"
