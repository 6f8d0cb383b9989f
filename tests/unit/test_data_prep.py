"""Data-prep: disjoint deterministic splits, correct loss masks, quarantine with reasons."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stages import data_prep, storage
from stages.runner import RunContext
from stages.tokenizers import ByteTokenizer
from tests.conftest import recipe_with


def test_splits_are_disjoint_and_sized(tmp_path) -> None:
    recipe = recipe_with(str(tmp_path))
    splits = data_prep.split_examples(data_prep.load_examples(recipe.data), recipe.data)
    ids = {name: {e.id for e in examples} for name, examples in splits.items()}
    assert len(ids["eval"]) == recipe.data.eval_prompts
    assert len(ids["grpo_train"]) == recipe.data.grpo_prompts
    assert len(ids["sft_train"]) == recipe.data.sft_examples
    assert not ids["eval"] & ids["sft_train"] and not ids["eval"] & ids["grpo_train"]
    assert not ids["grpo_train"] & ids["sft_train"]


def test_loss_mask_covers_exactly_the_response() -> None:
    tok = ByteTokenizer()
    example = data_prep.Example("e1", "src", "Calculate 2 + 2.", "2 + 2 = 4", "4")
    arrays, quarantined = data_prep.tokenize_sft([example], tok, seq_len=200)
    tokens, mask = arrays["input_tokens"][0], arrays["input_mask"][0]
    assert quarantined == []
    response = tok.decode([int(t) for t, m in zip(tokens, mask, strict=True) if m])
    assert response == "<reasoning>2 + 2 = 4</reasoning><answer>4</answer><end_of_turn>"
    prompt = tok.decode([int(t) for t, m in zip(tokens, mask, strict=True) if not m])
    assert prompt == data_prep.chat_prompt("Calculate 2 + 2.")
    assert tokens[0] == tok.bos_id() and mask[0] == 0
    last = int(np.flatnonzero(mask)[-1])
    assert tokens[last] == tok.eos_id()
    assert (tokens[last + 1 :] == tok.pad_id()).all()


def test_too_long_rows_are_quarantined_with_reason() -> None:
    tok = ByteTokenizer()
    short = data_prep.Example("s", "src", "1+1", "1 + 1 = 2", "2")
    long = data_prep.Example("l", "src", "x" * 300, "r", "1")
    arrays, quarantined = data_prep.tokenize_sft([short, long], tok, seq_len=160)
    assert arrays["input_tokens"].shape == (1, 160)
    assert [q["id"] for q in quarantined] == ["l"]
    assert "max_seq_len 160" in quarantined[0]["reason"]
    rows, bad = data_prep.prompt_rows([short, long], tok, prompt_len=128)
    assert [r["id"] for r in rows] == ["s"] and [q["id"] for q in bad] == ["l"]


def test_same_seed_same_fingerprint_other_seed_differs(tmp_path) -> None:
    recipe = recipe_with(str(tmp_path / "a"))
    first = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path / "a"), "r"))
    again = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path / "b"), "r"))
    assert not again.skipped  # a different root: really recomputed
    assert first.output.fingerprint == again.output.fingerprint
    other = recipe_with(str(tmp_path), data={"seed": 1})
    third = data_prep.prepare(other.data, other.model, RunContext(str(tmp_path / "c"), "r"))
    assert third.output.fingerprint != first.output.fingerprint


def test_prepared_dataset_has_record_and_files(tmp_path) -> None:
    recipe = recipe_with(str(tmp_path))
    outcome = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path), "r"))
    files = storage.list_files(outcome.output.uri)
    assert {"stage.json", "sft_train.npz", "grpo_prompts.jsonl", "eval_prompts.jsonl",
            "quarantine.jsonl"} <= set(files)  # fmt: skip
    record = json.loads((tmp_path / "r" / outcome.output.uri.rsplit("/", 1)[1] /
                         "stage.json").read_text())  # fmt: skip
    assert record["status"] == "complete" and record["output"]["kind"] == "dataset"
    rows = data_prep.load_prompts(outcome.output, "grpo_train")
    assert len(rows) == recipe.data.grpo_prompts and all(r["answer"] for r in rows)
    again = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path), "r"))
    assert again.skipped and again.output == outcome.output


def test_unknown_generator_is_a_clear_error(tmp_path) -> None:
    recipe = recipe_with(str(tmp_path), data={"generator": "no_such_generator"})
    with pytest.raises(ValueError, match="no_such_generator"):
        data_prep.load_examples(recipe.data)
