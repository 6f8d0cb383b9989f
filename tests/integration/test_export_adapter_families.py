"""`far export --adapter` for Qwen 3 and Llama 3 (their LoRA on attn.q/k/v/o_proj): the
adapter of a tiny Qwen 3 and a tiny Llama 3 (the smoke recipes' models, LoRA on every
projection, adapters given random weights) loads with peft on top of the base's own export
and gives the logits of FAR's merged export of the same policy, as the Gemma adapter does
(test_export_package)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml
from flax import nnx

from schemas.recipe import LoraSpec, MeshSpec, ModelSpec
from stages.modeling import models
from stages.modeling.hf_export import ExportOptions, export_model
from tests.integration.test_export_package import ATOL, load, logits
from tests.load_checks import load_warnings

pytestmark = pytest.mark.slow  # builds, exports and loads two models a family: ~20 CPU-s each

REPO = Path(__file__).resolve().parents[2]
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def exports(family: str, root: Path) -> tuple[Path, Path]:
    """(merged export, adapter export) of one LoRA policy on the family's smoke model."""
    recipe = yaml.safe_load((REPO / "recipes" / f"smoke-{family}.yaml").read_text())
    spec = ModelSpec.model_validate(recipe["model"])
    mesh = models.build_mesh(MeshSpec())
    base = models.build_base_model(spec, mesh, "unused-for-random")
    lora = LoraSpec(rank=4, alpha=8.0)
    policy = models.apply_lora(base, lora, mesh)
    # fresh adapters have lora_b == 0; give every adapter weights so there is work to do
    leaves, tree = jax.tree.flatten(nnx.state(policy, nnx.LoRAParam))
    keys = jax.random.split(jax.random.key(1), len(leaves))
    noisy = [
        0.05 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)
    ]
    nnx.update(policy, jax.tree.unflatten(tree, noisy))
    merged, adapter = root / "merged", root / "adapter"
    export_model(spec, base, policy, lora, str(root), str(merged), ExportOptions())
    export_model(spec, base, policy, lora, str(root), str(adapter), ExportOptions(adapter=True))
    return merged, adapter


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_adapter_export_on_the_base_export_equals_the_merged_logits(
    family: str, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    merged, adapter = exports(family, tmp_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["target_modules"] == sorted(PROJECTIONS)
    assert not (adapter / "model.safetensors").exists()  # the adapter alone, the base beside it
    with load_warnings() as caught, torch.no_grad():
        base = load(adapter / "base")
        base_logits = logits(base)
        model = peft.PeftModel.from_pretrained(base, str(adapter))
    assert caught == []
    ours, theirs = logits(model), logits(load(merged))
    gap = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs, strict=True))
    print(f"{family}: peft adapter vs merged export: max |logit difference| = {gap:.3g}")
    assert gap < ATOL
    # ...and the adapter matters: the base alone is far from the merged export
    assert (
        max(float(np.abs(a - b).max()) for a, b in zip(base_logits, theirs, strict=True))
        > 100 * ATOL
    )
