"""The TPU recipes scaled to the tiny model differ from the real ones only in the fields
scaling must replace: the tests that train them run the recipes' own stage settings."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.recipes import parse_recipe
from tests.scaled_recipes import (
    FULL_RUN_CHANGES,
    SCALED,
    STOP_RECIPE,
    TPU_RECIPES,
    TRAINED_RECIPES,
    devices_needed,
    evaluated_rows,
    full_run,
    recipe_data,
    scaled,
)


def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value for every leaf of a dumped recipe."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= leaves(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: value}


def covered(path: str) -> bool:
    return any(path == field or path.startswith(field + ".") for field in SCALED)


@pytest.mark.parametrize("name", TPU_RECIPES)
def test_a_scaled_recipe_differs_only_in_the_scaled_fields(name: str) -> None:
    original = leaves(parse_recipe(recipe_data(name), name).model_dump(mode="json"))
    small = leaves(scaled(name, "/tmp/unused").model_dump(mode="json"))
    changed = {p for p in original.keys() | small.keys() if original.get(p) != small.get(p)}
    assert changed, "scaling changed nothing"
    assert {p for p in changed if not covered(p)} == set()
    # what the TPU runs and the test must keep (spelled out: the exact settings)
    kept = ("sft.gradient_accumulation_steps", "sft.batch_size", "data.packing", "mesh.fsdp")
    kept += ("grpo.train_micro_batch_size", "grpo.num_iterations", "grpo.algorithm")
    kept += ("grpo.rewards.answer_match", "grpo.rewards.format_strict", "model.dtype")
    kept += ("model.family", "eval.batch_size", "sft.lora.rank", "grpo.batch_size")
    assert {p: small[p] for p in kept} == {p: original[p] for p in kept}


def test_the_scaled_recipes_keep_the_production_shapes() -> None:
    """The settings the tests exist for: accumulation 8, packing, GRPO micro-batches, bf16."""
    for name in TPU_RECIPES:
        recipe = scaled(name, "/tmp/unused")
        assert recipe.sft.gradient_accumulation_steps == 8 and recipe.data.packing
        assert recipe.grpo.train_micro_batch_size == 2 and recipe.model.dtype == "bfloat16"
        assert recipe.mesh.fsdp == devices_needed(name) and recipe.mesh.fsdp in (8, 16)
        # a checkpoint cadence that leaves an update without a checkpoint (stop tests need it)
        assert recipe.sft.max_steps > recipe.sft.checkpoint_every_steps > 1


def test_the_untrained_tpu_recipe_is_a_trained_one_on_another_mesh() -> None:
    """tpu-gemma3-1b-v5e8 is not trained on CPU: it is the v5e16 recipe on half the chips
    (every other field equal), and its fsdp 8 mesh is trained by the Kaggle recipe."""
    untrained = set(TPU_RECIPES) - set(TRAINED_RECIPES)
    assert untrained == {"tpu-gemma3-1b-v5e8"}
    v5e8 = leaves(parse_recipe(recipe_data("tpu-gemma3-1b-v5e8"), "v5e8").model_dump(mode="json"))
    v5e16 = leaves(
        parse_recipe(recipe_data("tpu-gemma3-1b-v5e16-multihost"), "v5e16").model_dump(mode="json")
    )
    changed = {p for p in v5e8.keys() | v5e16.keys() if v5e8.get(p) != v5e16.get(p)}
    assert changed == {"name", "mesh.fsdp"}, changed
    assert {scaled(name, "/tmp/unused").mesh.fsdp for name in TRAINED_RECIPES} == {8, 16}


def test_the_full_runs_change_only_their_listed_settings() -> None:
    """Each trained recipe's full run is its scaled recipe with FULL_RUN_CHANGES' fields only:
    the Kaggle run evaluates every model and trains the steps the stop and kill tests resume
    across; the v5e16 run still spans an SFT update and a GRPO step, and evaluates a model."""
    assert set(FULL_RUN_CHANGES) == set(TRAINED_RECIPES)
    for name in TRAINED_RECIPES:
        small = leaves(scaled(name, "/tmp/unused").model_dump(mode="json"))
        run = leaves(full_run(name, "/tmp/unused").model_dump(mode="json"))
        changed = {p for p in small.keys() | run.keys() if small.get(p) != run.get(p)}
        listed = {
            f"{section}.{field}"
            for section, fields in FULL_RUN_CHANGES[name].items()
            for field in fields
        }
        assert changed == listed, name
    kaggle = full_run(STOP_RECIPE, "/tmp/unused")
    assert kaggle.grpo.num_iterations == 2 and kaggle.sft == scaled(STOP_RECIPE, "/x").sft
    assert evaluated_rows(kaggle) == ["base", "base-3shot", "sft", "grpo"]
    v5e16 = full_run("tpu-gemma3-1b-v5e16-multihost", "/tmp/unused")
    assert v5e16.sft.max_steps == 2 and v5e16.grpo.max_steps == 2
    assert v5e16.grpo.num_iterations == 1 and evaluated_rows(v5e16) == ["grpo"]
