"""Stages refuse bad inputs before any compute, with a message that says what is wrong.

The inputs are real: a tiny SFT checkpoint trained here (on a memory:// root, which also
exercises publishing Orbax checkpoints to a non-Orbax filesystem and restoring from it).
"""

from __future__ import annotations

import time
import uuid

import pytest

from schemas.artifacts import CheckpointArtifact, DatasetArtifact
from schemas.recipe import Recipe
from stages import sft
from stages.core import storage
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.evaluate import evaluation as evaluate
from stages.grpo import training as grpo
from tests.conftest import recipe_with

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained() -> tuple[Recipe, RunContext, DatasetArtifact, CheckpointArtifact]:
    root = f"memory://far-bad-inputs-{uuid.uuid4().hex[:8]}"
    # two SFT steps and a checkpoint; GRPO's rollouts as short as test_shared_weights' (the
    # same compiled programs)
    recipe = recipe_with(
        root,
        sft={"max_steps": 2, "checkpoint_every_steps": 2},
        grpo={"max_steps": 1, "max_generation_tokens": 8},
    )
    ctx = RunContext(root=root, run=recipe.name)
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    checkpoint = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output
    return recipe, ctx, dataset, checkpoint


def _other_model(recipe: Recipe) -> Recipe:
    arch = recipe.model.architecture.model_copy(update={"embed_dim": 64})
    return recipe.model_copy(
        update={"model": recipe.model.model_copy(update={"architecture": arch})}
    )


def _stage_dirs(ctx: RunContext, stage: str) -> list[str]:
    return sorted(
        {p.split("/", 1)[0] for p in storage.list_files(ctx.run_uri) if p.startswith(f"{stage}-")}
    )


def test_dataset_uri_that_does_not_exist(trained) -> None:
    recipe, ctx, dataset, _ = trained
    missing = dataset.model_copy(update={"uri": f"{ctx.run_uri}/data_prep-000000000000"})
    started = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"data_prep-000000000000.*not a committed"):
        sft.train(
            missing, recipe.sft.model_copy(update={"seed": 9}), recipe.model, recipe.mesh, ctx
        )
    assert time.perf_counter() - started < 2.0  # refused before building any model
    assert len(_stage_dirs(ctx, "sft")) == 1  # only the fixture's real SFT run


def test_checkpoint_of_another_model_config(trained) -> None:
    recipe, ctx, dataset, checkpoint = trained
    other = _other_model(recipe)
    started = time.perf_counter()
    with pytest.raises(
        ValueError, match=r"another model config.*architecture\.embed_dim.*128 -> 64"
    ):
        grpo.reinforce(dataset, checkpoint, other.grpo, other.model, other.mesh, ctx)
    with pytest.raises(ValueError, match="another model config"):
        evaluate.evaluate(
            dataset,
            {"sft": checkpoint},
            other.eval.model_copy(update={"models": ["sft"]}),
            other.model,
            other.mesh,
            ctx,
        )
    assert time.perf_counter() - started < 2.0
    assert _stage_dirs(ctx, "grpo") == [] and _stage_dirs(ctx, "evaluate") == []


def test_checkpoint_uri_that_does_not_exist(trained) -> None:
    recipe, ctx, dataset, checkpoint = trained
    gone = checkpoint.model_copy(update={"uri": f"{ctx.run_uri}/sft-ffffffffffff/checkpoints"})
    with pytest.raises(FileNotFoundError, match=r"sft-ffffffffffff.*no committed step 2"):
        grpo.reinforce(dataset, gone, recipe.grpo, recipe.model, recipe.mesh, ctx)


def test_dataset_tokenized_for_another_tokenizer(trained) -> None:
    recipe, ctx, dataset, _ = trained
    foreign = dataset.model_copy(update={"tokenizer": "gemma3-sentencepiece"})
    with pytest.raises(ValueError, match=r"tokenized with 'gemma3-sentencepiece'.*'bytes-v1'"):
        sft.train(foreign, recipe.sft, recipe.model, recipe.mesh, ctx)


def test_the_good_checkpoint_restores_from_memory_root(trained) -> None:
    """The control: the same checkpoint with the right config is accepted and trains."""
    recipe, ctx, dataset, checkpoint = trained
    outcome = grpo.reinforce(dataset, checkpoint, recipe.grpo, recipe.model, recipe.mesh, ctx)
    assert outcome.output.uri.startswith("memory://") and outcome.output.step == 1
    assert any(f.startswith("1/model_params/") for f in storage.list_files(outcome.output.uri))
