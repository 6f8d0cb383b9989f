"""Qwen 3 and Llama 3 through Tunix's own networks (FAR beyond Gemma): each family's tiny
recipe runs data_prep -> SFT -> GRPO -> evaluate in process, its GRPO checkpoint exports as a
Qwen3ForCausalLM / LlamaForCausalLM directory that transformers loads without a warning, and
transformers' logits equal FAR's on the same weights (LoRA merged). The export's weights also
load back through Tunix's own params module (the path a real checkpoint takes) unchanged."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from schemas.artifacts import CheckpointArtifact
from schemas.recipe import MeshSpec
from stages import sft
from stages.core.runner import RunContext
from stages.core.shared import SharedBuilds
from stages.data_prep import build as data_prep
from stages.evaluate import evaluation as evaluate
from stages.grpo import training as grpo
from stages.modeling import families, models
from stages.modeling.hf_export import export_checkpoint
from stages.modeling.tokenizers import build_tokenizer
from tests.conftest import recipe_with

ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama3": "LlamaForCausalLM"}
# one prompt: each length is another set of eager-op compilations on three networks
PROMPT = "<start_of_turn>user\nCalculate 2 + 3.<end_of_turn>\n<start_of_turn>model\nThe sky"


def _tiny_run(family: str, ctx: RunContext) -> CheckpointArtifact:
    """The family's smoke recipe at the fewest steps that train, checkpoint and evaluate."""
    recipe = recipe_with(
        ctx.root,
        base=f"smoke-{family}",
        data={"eval": {"size": 4}, "grpo": {"size": 4}, "sft": {"size": 16}},
        sft={"max_steps": 2, "checkpoint_every_steps": 2},
        grpo={
            "max_steps": 1,
            "num_generations": 2,
            "max_generation_tokens": 8,
            "checkpoint_every_steps": 1,
        },
        eval={"models": ["grpo"], "max_generation_tokens": 8, "batch_size": 4},
    )
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    trained = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output
    reinforced = grpo.reinforce(dataset, trained, recipe.grpo, recipe.model, recipe.mesh, ctx)
    report = evaluate.evaluate(
        dataset, {"grpo": reinforced.output}, recipe.eval, recipe.model, recipe.mesh, ctx
    ).output
    assert [s.name for s in report.scores] == ["grpo"]
    assert reinforced.output.model.family == family and reinforced.output.lora is not None
    return reinforced.output


def _logits(network: nnx.Module, ids: list[int]) -> np.ndarray:
    n = len(ids)
    mask = jnp.tril(jnp.ones((1, n, n), dtype=bool))
    logits, _ = network(jnp.asarray([ids]), jnp.arange(n)[None], None, mask)  # type: ignore[operator]
    return np.asarray(logits[0])


# ~45 CPU-s a family: the compilations of every stage (make test runs it). Llama 3 is not run
# here: tests/integration/test_hf_checkpoint_run.py trains a Llama 3.2 checkpoint through
# every stage and checks its merged and adapter exports against transformers (1e-4).
@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3"])
def test_family_runs_every_stage_and_exports_transformers_logits(
    family: str, tmp_path: Path, model_cache: str, caplog: pytest.LogCaptureFixture
) -> None:
    torch = pytest.importorskip("torch")
    import transformers

    # one base network for the run's stages, as a flow run shares it
    ctx = RunContext(str(tmp_path / "runs"), family, cache_dir=model_cache, shared=SharedBuilds())
    checkpoint = _tiny_run(family, ctx)
    out = export_checkpoint(checkpoint.uri, str(tmp_path / "hf"), model_cache)
    assert json.loads(Path(out, "config.json").read_text())["architectures"] == [
        ARCHITECTURES[family]
    ]
    # transformers' loggers do not propagate to the root logger: listen on theirs
    hf_logger = logging.getLogger("transformers")
    hf_logger.addHandler(caplog.handler)
    caplog.clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    finally:
        hf_logger.removeHandler(caplog.handler)
    assert [str(w.message) for w in caught] == []
    said = [r for r in caplog.records if r.name.startswith("transformers")]
    assert [r.getMessage() for r in said if r.levelno >= logging.WARNING] == []

    mesh = models.build_mesh(MeshSpec())
    base = models.base_model(checkpoint.model, mesh, model_cache, ctx.shared, private=False)
    policy = models.policy_network(checkpoint, mesh, model_cache, ctx.shared, base=base)
    tokenizer = build_tokenizer(checkpoint.model, model_cache)
    network_class, load = families.get(family).network_modules()
    config = models.tunix_config(checkpoint.model)
    with mesh:  # the export read back by Tunix's own params module (a real checkpoint's path)
        reloaded = load(out, config, mesh=mesh, dtype=jnp.float32)
    assert isinstance(reloaded, network_class)
    ids = [tokenizer.bos_id(), *tokenizer.encode(PROMPT)]
    with mesh:
        ours, unmerged, back = (_logits(m, ids) for m in (policy, base, reloaded))
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].numpy()
    # f32 on both sides, 2 layers: the gap measured ~2e-6 (gemma's test allows 1e-3)
    np.testing.assert_allclose(ours, theirs, atol=1e-3, rtol=0)
    np.testing.assert_allclose(back, ours, atol=1e-4, rtol=0)
    # ...and training moved the policy: exporting the base alone would fail the check
    assert np.abs(ours - unmerged).max() > 1e-3


def test_default_lora_targets_each_family_projections(model_cache: str) -> None:
    """The default module_path (Gemma's names) adapts Qwen 3's and Llama 3's q/k/v/o and MLP
    projections; a regex that matches nothing is refused, naming the field."""
    from stages.core.errors import InputError

    for family in ARCHITECTURES:
        recipe = recipe_with("/unused", base=f"smoke-{family}")
        mesh = models.build_mesh(recipe.mesh)
        base = models.build_base_model(recipe.model, mesh, model_cache)
        lora = models.apply_lora(base, recipe.sft.lora, mesh)
        adapted = {
            ".".join(map(str, path[2:-1]))  # layers.N.<module>.<adapter> -> <module>
            for path, value in nnx.iter_graph(lora)
            if isinstance(value, nnx.LoRAParam)
        }
        assert adapted == {
            *("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj"),
            *("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
        }
        bad = recipe.sft.lora.model_copy(update={"module_path": ".*q_einsum"})
        with pytest.raises(InputError, match=r"lora\.module_path"):
            models.apply_lora(base, bad, mesh)
