"""Model families and presets: the configs TPU recipes name resolve to the right networks,
and the gemma2 path (the Kaggle recipe's family) builds, trains and generates on CPU."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from schemas.recipe import ModelSpec
from stages import sft
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.evaluate import evaluation as evaluate
from stages.modeling import models
from tests.conftest import recipe_with

# preset -> (family, layers, width, parameters in billions: the published model sizes)
PRESETS = {
    "gemma3_270m": ("gemma3", 18, 640, 0.27),
    "gemma3_1b": ("gemma3", 26, 1152, 1.0),
    "gemma2_2b": ("gemma2", 26, 2304, 2.6),
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_configs_and_sizes(preset: str) -> None:
    family, layers, width, billions = PRESETS[preset]
    spec = ModelSpec.model_validate(
        {
            "family": family,
            "source": "hub",
            "uri": "org/name",
            "preset": preset,
            "tokenizer": "sentencepiece",
        }
    )
    config = models.tunix_config(spec)
    assert (config.num_layers, config.embed_dim) == (layers, width)
    model_class, _ = models.network_modules(family)
    abstract = nnx.eval_shape(lambda: model_class(config, rngs=nnx.Rngs(params=0)))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert abs(count / 1e9 - billions) / billions < 0.15, count


@pytest.mark.slow
def test_tiny_gemma2_trains_and_generates(tmp_path) -> None:
    recipe = recipe_with(
        str(tmp_path),
        model={"family": "gemma2"},
        sft={"max_steps": 4, "checkpoint_every_steps": 2},
        eval={"models": ["base", "sft"], "max_generation_tokens": 8},
    )
    ctx = RunContext(str(tmp_path), "g2")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    trained = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx)
    assert trained.output.model.family == "gemma2"
    report = evaluate.evaluate(
        dataset, {"sft": trained.output}, recipe.eval, recipe.model, recipe.mesh, ctx
    ).output
    assert [s.name for s in report.scores] == ["base", "base-3shot", "sft"]
