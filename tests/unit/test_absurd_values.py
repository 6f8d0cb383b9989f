"""Absurd recipe values: each is refused by validation, naming the field, the
value given and what was expected, while every bundled recipe still validates."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from flows.cli import build_parser
from pipeline.recipes import RecipeError, load_recipe, parse_recipe
from tests.conftest import REPO, smoke_data

ABSURD = [
    # (dotted path, absurd value, text naming the field, text saying what was expected)
    ("sft.learning_rate", 5.0, "sft.learning_rate", "less than or equal to 1"),
    ("grpo.learning_rate", 3.0, "grpo.learning_rate", "less than or equal to 1"),
    ("sft.learning_rate", float("inf"), "sft.learning_rate", "finite"),
    ("grpo.temperature", 90.0, "grpo.temperature", "less than or equal to 5"),
    ("grpo.temperature", float("inf"), "grpo.temperature", "less than or equal to 5"),
    ("eval.temperature", 50.0, "eval.temperature", "less than or equal to 5"),
    ("grpo.epsilon", 2.0, "grpo.epsilon", "less than 1"),
    ("grpo.max_grad_norm", float("inf"), "grpo.max_grad_norm", "finite"),
    ("sft.save_margin_seconds", float("inf"), "sft.save_margin_seconds", "finite"),
    ("sft.weight_decay", float("nan"), "sft.weight_decay", "finite"),
    ("sft.lora.alpha", float("inf"), "sft.lora.alpha", "finite"),
    ("sft.lora.rank", 4096, "sft.lora.rank=4096", "at most 128"),
    ("grpo.max_generation_tokens", 10**7, "grpo.max_generation_tokens=10000000", "at most 1280"),
    ("eval.max_generation_tokens", 10**6, "eval.max_generation_tokens=1000000", "at most 1280"),
    ("eval.batch_size", 100_000, "eval.batch_size=100000", "at most 64"),
    ("data.sft.size", 100_000, "sft.size 100000 = 100000", "at most 800"),
    ("data.grpo.size", 700, "eval.size 16 + grpo.size 700 + sft.size 128 = 844", "at most 800"),
    # counts, lengths and seeds: each bound names the value and the range
    ("sft.max_steps", 10**23, "sft.max_steps", "less than or equal to 10000000"),
    ("grpo.max_steps", 10**12, "grpo.max_steps", "less than or equal to 10000000"),
    ("eval.samples", 10**8, "eval.samples", "less than or equal to 1024"),
    ("data.seed", -1, "data.seed", "greater than or equal to 0"),
    ("sft.seed", -1, "sft.seed", "greater than or equal to 0"),
    ("grpo.seed", 2**40, "grpo.seed", "less than or equal to 2147483647"),
    ("eval.seed", -1, "eval.seed", "greater than or equal to 0"),
    ("model.init_seed", -1, "model.init_seed", "greater than or equal to 0"),
    ("data.max_seq_len", 10**8, "data.max_seq_len", "less than or equal to 131072"),
    # already refused before this issue; kept here so the set stays whole
    ("grpo.top_p", 1.5, "grpo.top_p", "less than or equal to 1"),
    ("grpo.num_generations", 1, "grpo.num_generations", "greater than or equal to 2"),
    ("grpo.beta", -0.1, "grpo.beta", "greater than or equal to 0"),
    ("sft.lora.rank", 0, "sft.lora.rank", "greater than 0"),
    ("sft.lora.alpha", 0.0, "sft.lora.alpha", "greater than 0"),
]


def _with(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(smoke_data())
    *parents, leaf = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[leaf] = value
    return data


@pytest.mark.parametrize(("path", "value", "named", "expected"), ABSURD)
def test_absurd_value_is_refused_naming_it(path: str, value: Any, named: str, expected: str):
    with pytest.raises(RecipeError) as info:
        parse_recipe(_with(path, value), "absurd.yaml")
    message = str(info.value)
    assert named in message
    assert expected in message
    assert repr(value) in message or str(value) in message


def test_node_config_is_checked_too() -> None:
    data = _with("name", "smoke")
    data["pipeline"] = [
        {"id": "data_prep", "kind": "data_prep"},
        {"id": "sft", "kind": "sft", "inputs": {"dataset": "data_prep"}},
        {
            "id": "evaluate",
            "kind": "evaluate",
            "inputs": {"dataset": "data_prep", "sft": "sft"},
            "config": {"models": ["sft"], "batch_size": 4096},
        },
    ]
    with pytest.raises(RecipeError, match=r"pipeline node 'evaluate' config.batch_size=4096"):
        parse_recipe(data, "absurd.yaml")


def _with_node(kind: str, config: dict[str, Any]) -> dict[str, Any]:
    data = _with("name", "smoke")
    data["pipeline"] = [
        {"id": "data_prep", "kind": "data_prep"},
        {"id": "sft", "kind": "sft", "inputs": {"dataset": "data_prep"}},
        {"id": "node", "kind": kind, "inputs": {"dataset": "data_prep", "policy": "sft"}},
    ]
    data["pipeline"][2]["config"] = config
    return data


@pytest.mark.parametrize(
    ("kind", "config", "named"),
    [
        (
            "self_teach",
            {"samples": 10**6},
            "self_teach.config.samples: Input should be less than or equal to 1024 (got 1000000)",
        ),
        (
            "self_teach",
            {"seed": -1},
            "self_teach.config.seed: Input should be greater than or equal to 0 (got -1)",
        ),
        (
            "dpo",
            {"max_steps": 10**23},
            "dpo.config.max_steps: Input should be less than or "
            "equal to 10000000 (got 100000000000000000000000)",
        ),
    ],
)
def test_node_counts_and_seeds_are_bounded(kind: str, config: dict[str, Any], named: str) -> None:
    with pytest.raises(RecipeError, match=re.escape(named)):
        parse_recipe(_with_node(kind, config), "absurd.yaml")


@pytest.mark.parametrize("wait", ["nan", "inf", "-1", "-inf", "soon"])
def test_lease_wait_must_be_finite_and_non_negative(wait: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["run", "recipes/smoke.yaml", f"--lease-wait={wait}"])
    assert info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--lease-wait: got {wait!r}; expected a finite number of seconds >= 0" in error


def test_lease_wait_accepts_seconds() -> None:
    args = build_parser().parse_args(["run", "recipes/smoke.yaml", "--lease-wait", "90.5"])
    assert args.lease_wait == 90.5


@pytest.mark.parametrize("recipe", sorted((REPO / "recipes").glob("*.yaml")), ids=lambda p: p.stem)
def test_bundled_recipes_still_validate(recipe) -> None:
    load_recipe(str(recipe))
