"""The continued-SFT control of reinforce-generalize trains on the gold chains of the prompts
GRPO trains on: data_prep keeps each grpo prompt's gold target (`data.gold_targets`), and a
hard_subset with `gold_sft` writes the kept prompts' targets as its sft_train split, tokenized
exactly as data_prep tokenizes its own sft rows. The DAG lets an sft node read that split only
when the subset writes it, and only from a data_prep that keeps the targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.dag import build_dag
from pipeline.recipes import RecipeError
from schemas.artifacts import DatasetArtifact
from schemas.recipe import HardSubsetConfig
from stages import hard_subset
from stages.core.datasets import load_prompts, pad_rows
from stages.core.errors import InputError
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.modeling.tokenizers import build_tokenizer
from stages.registry import hashed_config
from tests.conftest import recipe_with
from tests.scaled_recipes import scaled_generalize
from tests.unit.test_dag import DATA, EVAL_TRAIN, GRPO, SFT, node, pipeline

GOLD = {"model": "rl", "gold_sft": True}


def _prepared(tmp_path: Path) -> tuple[Any, DatasetArtifact, RunContext]:
    recipe = scaled_generalize(str(tmp_path))
    ctx = RunContext(str(tmp_path), "gold", model=recipe.model)
    return recipe, data_prep.prepare(recipe.data, recipe.model, ctx).output, ctx


def test_grpo_rows_carry_their_gold_targets_and_the_subset_trains_on_them(
    tmp_path: Path,
) -> None:
    recipe, dataset, ctx = _prepared(tmp_path)
    tokenizer = build_tokenizer(recipe.model, ctx.model_cache, ctx.shared)
    splits, prompt = data_prep.draw_splits(recipe.data, tokenizer, data_prep.Quarantine())
    examples = {e.id: e for e in splits["grpo_train"]}
    rows = load_prompts(dataset, "grpo_train")
    assert len(rows) == len(examples) == recipe.data.grpo.size
    assert all(r["target"].startswith("<reasoning>") for r in rows)
    assert all(r["target"].count(" = ") >= 2 for r in rows)  # 3 terms: a chain of 2 steps
    assert not any("target" in r for r in load_prompts(dataset, "eval"))
    kept = rows[1::2]  # a subset, in the split's order
    arrays, metrics = hard_subset.gold_arrays(kept, dataset, ctx)
    # the very rows data_prep writes for these examples as sft rows (worked chains, one step
    # an operation), padded to the dataset's rows
    expected = pad_rows(
        [data_prep.sft_sequence(examples[r["id"]], tokenizer, prompt) for r in kept],
        dataset.seq_len,
        tokenizer.pad_id(),
    )
    assert metrics == {"gold_rows": float(len(kept)), "gold_rows_too_long": 0.0}
    for name, array in expected.items():
        np.testing.assert_array_equal(arrays[name], array, err_msg=name)


def test_a_row_too_long_is_left_out_and_rows_without_targets_are_refused(
    tmp_path: Path,
) -> None:
    _, dataset, ctx = _prepared(tmp_path)
    rows = load_prompts(dataset, "grpo_train")
    long = {**rows[0], "target": rows[0]["target"] * 20}
    _, metrics = hard_subset.gold_arrays([long, *rows[1:3]], dataset, ctx)
    assert metrics == {"gold_rows": 2.0, "gold_rows_too_long": 1.0}
    bare = {k: v for k, v in rows[0].items() if k != "target"}
    with pytest.raises(InputError, match=r"set data\.gold_targets: true"):
        hard_subset.gold_arrays([bare, *rows[1:3]], dataset, ctx)


def test_the_options_at_their_defaults_leave_the_stage_hashes_alone(tmp_path: Path) -> None:
    recipe = recipe_with(str(tmp_path))
    assert "gold_targets" not in hashed_config("data_prep", recipe.data)
    assert "gold_sft" not in hashed_config("hard_subset", HardSubsetConfig(model="grpo"))
    assert hashed_config("hard_subset", HardSubsetConfig(**GOLD))["gold_sft"] is True


def test_an_sft_node_reads_the_gold_split_of_a_subset_that_writes_it() -> None:
    hard = node("hard", "hard_subset", GOLD, evaluation="eval_train", dataset="data")
    control = node("control", "sft", dataset="hard", policy="tune")
    nodes = pipeline(DATA, SFT, GRPO, EVAL_TRAIN, hard, control)
    recipe = recipe_with("/tmp/far-gold", data={"gold_targets": True}, pipeline=nodes)
    assert build_dag(recipe).ids[-1] == "control"
    with pytest.raises(RecipeError, match=r"only a data_prep node with data\.gold_targets: true"):
        recipe_with("/tmp/far-gold", pipeline=nodes)
    plain = node("hard", "hard_subset", {"model": "rl"}, evaluation="eval_train", dataset="data")
    with pytest.raises(RecipeError, match="expected a dataset with split sft_train"):
        recipe_with(
            "/tmp/far-gold",
            data={"gold_targets": True},
            pipeline=pipeline(DATA, SFT, GRPO, EVAL_TRAIN, plain, control),
        )
