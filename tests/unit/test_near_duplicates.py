"""Trivially reworded copies of eval questions in a training split: data_prep reports them (a
record metric and one console line), and `data.drop_near_duplicates` keeps them out.

A copy here differs from its eval question only where the exact/normalized de-duplication
does not look: spacing around an operator and brackets ("What is 3+4?" / "what is (3 + 4)").
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from stages.core import storage
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.modeling.tokenizers import ByteTokenizer
from stages.registry import hashed_config
from tests.conftest import recipe_with

PAIRS = [(a, a + 5) for a in range(10, 18)]  # the eval questions' operands


def _rows(path: Path, rows: list[tuple[str, int]]) -> dict[str, Any]:
    path.write_text("".join(json.dumps({"q": q, "a": str(a)}) + "\n" for q, a in rows))
    return {"kind": "file", "name": str(path), "columns": {"prompt": "q", "answer": "a"}}


def _recipe(tmp_path: Path, drop: bool | None = None) -> Any:
    held_out = _rows(tmp_path / "eval.jsonl", [(f"What is {a}+{b}?", a + b) for a, b in PAIRS])
    copies = [(f"what is ({a} + {b})", a + b) for a, b in PAIRS]
    others = [(f"What is {a}*3?", a * 3) for a in range(40, 56)]
    train = _rows(tmp_path / "train.jsonl", copies + others)
    data: dict[str, Any] = {
        "eval": {"size": len(PAIRS), "sources": [held_out]},
        "grpo": {"size": 4, "sources": [train]},
        "sft": {"size": 12, "sources": [train]},
    }
    if drop is not None:
        data["drop_near_duplicates"] = drop
    return recipe_with(str(tmp_path), data=data)


def _prepare(tmp_path: Path, drop: bool | None) -> tuple[Any, dict[str, float], set[str]]:
    recipe = _recipe(tmp_path, drop)
    outcome = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path), "near"))
    dataset = outcome.output
    record = storage.read_json(storage.join(dataset.uri, "stage.json"))
    trained = {
        json.loads(line)["prompt"]
        for line in storage.read_text(storage.join(dataset.uri, "grpo_prompts.jsonl")).split("\n")
        if line
    }
    return dataset, record["metrics"], trained


def test_near_duplicates_of_eval_prompts_are_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recipe = _recipe(tmp_path)
    splits, _ = data_prep.draw_splits(recipe.data, ByteTokenizer(), data_prep.Quarantine())
    copied = {f"what is ({a} + {b})" for a, b in PAIRS}
    expected = {s: sum(e.prompt in copied for e in splits[s]) for s in data_prep.TRAINING}
    assert sum(expected.values()) >= 4  # 16 drawn of 24 rows, 16 of them no copies
    assert data_prep.near_duplicates(splits) == expected
    with caplog.at_level(logging.WARNING, logger="stages.data_prep.build"):
        _, metrics, _ = _prepare(tmp_path, None)
    assert metrics["near_duplicates"] == sum(expected.values())
    assert metrics["near_duplicates_dropped"] == 0
    [line] = [r.getMessage() for r in caplog.records if "near-duplicates" in r.getMessage()]
    assert f"{sum(expected.values())} training examples are near-duplicates" in line
    assert "data.drop_near_duplicates: true" in line


def test_drop_near_duplicates_keeps_them_out_of_the_training_splits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="stages.data_prep.build"):
        dataset, metrics, grpo_prompts = _prepare(tmp_path, True)
    assert metrics["near_duplicates"] == 0 and metrics["near_duplicates_dropped"] > 0
    assert dataset.split_sizes == {"eval": 8, "grpo_train": 4, "sft_train": 12}  # drawn on
    assert not any("+" in p for p in grpo_prompts)
    quarantined = storage.read_text(storage.join(dataset.uri, "quarantine.jsonl"))
    assert "near-duplicate of a held-out prompt: " in quarantined
    [line] = [r.getMessage() for r in caplog.records if "near-duplicates" in r.getMessage()]
    assert "training examples dropped as near-duplicates" in line


def test_the_key_sets_aside_case_spacing_and_punctuation_but_not_numbers_or_operators() -> None:
    key = data_prep.near_key
    assert key("What is 3+4?") == key("  what IS (3 + 4) ") == key("What is 3 + 4 ?!")
    assert key("What is 3 + 4?") != key("What is 3 - 4?")
    assert key("What is 12 + 4?") != key("What is 1 2 + 4?")
    assert key("Reverse the word w3ord.") != key("Reverse the word w4ord.")


def test_the_option_at_its_default_leaves_the_stage_hash_alone(tmp_path: Path) -> None:
    assert "drop_near_duplicates" not in hashed_config("data_prep", _recipe(tmp_path).data)
    assert hashed_config("data_prep", _recipe(tmp_path, False).data) == hashed_config(
        "data_prep", _recipe(tmp_path).data
    )
    assert hashed_config("data_prep", _recipe(tmp_path, True).data)["drop_near_duplicates"]
