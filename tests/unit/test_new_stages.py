"""The pure parts of the hard_subset, self_teach, preferences and dpo stages, table-driven."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from schemas.recipe import HardSubsetConfig, SelfTeachConfig
from stages import dpo, hard_subset, preferences, self_teach
from stages.modeling.tokenizers import ByteTokenizer

SAMPLES = [
    {"model": "grpo", "id": "a", "correct": 1.0},
    {"model": "grpo", "id": "a", "correct": 0.0},
    {"model": "grpo", "id": "b", "correct": 0.0},
    {"model": "grpo", "id": "c", "correct": 1.0},
    {"model": "sft", "id": "c", "correct": 0.0},
]

# (below, min_prompts) -> the ids kept, hardest first
HARD_CASES: list[tuple[float, int, list[str]]] = [
    (1.0, 1, ["b", "a"]),  # any failed sample
    (0.5, 1, ["b"]),  # mean correctness under one half
    (0.25, 1, ["b"]),
    (0.5, 3, ["b", "a", "c"]),  # topped up with the next hardest
]


@pytest.mark.parametrize(("below", "min_prompts", "expected"), HARD_CASES)
def test_hard_ids(below: float, min_prompts: int, expected: list[str]) -> None:
    scores = hard_subset.prompt_scores(SAMPLES, "grpo")
    assert scores == {"a": 0.5, "b": 0.0, "c": 1.0}
    config = HardSubsetConfig(model="grpo", below=below, min_prompts=min_prompts)
    assert hard_subset.hard_ids(scores, config) == expected


# (above, below, min_prompts) -> the ids kept: the informative band drops the prompts always
# (c: 1.0) and never (b: 0.0) solved; a top-up takes the prompts nearest the band
BAND_SCORES = {"a": 0.5, "b": 0.0, "c": 1.0, "d": 0.75, "e": 0.125}
BAND_CASES: list[tuple[float, float, int, list[str]]] = [
    (0.0, 1.0, 1, ["e", "a", "d"]),
    (0.2, 1.0, 1, ["a", "d"]),  # e (0.125) is under the band
    (0.0, 0.6, 1, ["e", "a"]),  # d (0.75) is over it
    (0.0, 1.0, 4, ["e", "a", "d", "b"]),  # b and c both lie 0 outside: the lower score first
    (0.2, 0.6, 3, ["a", "e", "d"]),  # e lies 0.075 under the band, d 0.15 over it
]


@pytest.mark.parametrize(("above", "below", "min_prompts", "expected"), BAND_CASES)
def test_informative_band(
    above: float, below: float, min_prompts: int, expected: list[str]
) -> None:
    config = HardSubsetConfig(model="sft", above=above, below=below, min_prompts=min_prompts)
    assert hard_subset.hard_ids(BAND_SCORES, config) == expected


def test_band_must_be_open() -> None:
    with pytest.raises(ValueError, match=r"above=0.5 must be less than below=0.5"):
        HardSubsetConfig(model="sft", above=0.5, below=0.5)


def test_hard_subset_names_the_models_it_has() -> None:
    with pytest.raises(ValueError, match=r"no samples of model 'rl'; it has \['grpo', 'sft'\]"):
        hard_subset.prompt_scores(SAMPLES, "rl")
    with pytest.raises(ValueError, match="min_prompts is 5 but the evaluation scored only 3"):
        hard_subset.hard_ids(
            {"a": 1.0, "b": 1.0, "c": 1.0}, HardSubsetConfig(model="x", min_prompts=5)
        )


ROW = {"id": "p1", "prompt": "Q?", "answer": "4"}
GOOD = "<reasoning>2+2</reasoning><answer>4</answer>"
WRONG = "<reasoning>2+2</reasoning><answer>5</answer>"


def test_self_teach_keeps_verified_distinct_samples() -> None:
    config = SelfTeachConfig(samples=4, verify=["format_strict", "answer_match"], keep_per_prompt=2)
    scored = self_teach.verified([ROW], [GOOD, WRONG, GOOD, "no tags"], config)
    assert [s["verified"] for s in scored] == [True, False, True, False]
    assert scored[1]["rewards"] == {"format_strict": 1.0, "answer_match": 0.0}
    kept = self_teach.keep(scored, per_prompt=2)
    assert [(k["prompt_id"], k["sample"]) for k in kept] == [("p1", 0)]  # sample 2 repeats 0


def test_self_teach_sequence_masks_the_prompt() -> None:
    tokenizer = ByteTokenizer()
    tokens, mask = self_teach.sft_sequence("Q?", GOOD + "<end_of_turn>", tokenizer)
    head = 1 + len(tokenizer.encode("Q?"))
    assert mask == [0] * head + [1] * (len(tokens) - head)
    assert tokens[-1] == tokenizer.eos_id()
    assert tokenizer.decode(tokens[head:-1]) == GOOD + "<end_of_turn>"  # one end of turn


# (row, adapter) -> (chosen, rejected) or None
PAIR_ROWS: list[tuple[dict[str, Any], str, tuple[str, str] | None]] = [
    ({"prompt": "q", "chosen": "good", "rejected": "bad"}, "pairs", ("good", "bad")),
    ({"prompt": "q", "chosen": "same", "rejected": "same"}, "pairs", None),
    (
        {
            "instruction": "q",
            "completions": [
                {"response": "mid", "overall_score": 5},
                {"response": "best", "overall_score": 9},
                {"response": "worst", "overall_score": 2},
            ],
        },
        "ultrafeedback",
        ("best", "worst"),
    ),
    (
        {"instruction": "q", "completions": [{"response": "x", "overall_score": 5}]},
        "ultrafeedback",
        None,
    ),
    (
        {
            "prompt": "q",
            "chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "yes"}],
            "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "no"}],
        },
        "ultrafeedback",
        ("yes", "no"),
    ),
]


@pytest.mark.parametrize(("row", "adapter", "expected"), PAIR_ROWS)
def test_preference_rows(
    row: dict[str, Any], adapter: str, expected: tuple[str, str] | None
) -> None:
    pair = preferences.pair_from_row(row, adapter)
    if expected is None:
        assert pair is None
        return
    assert pair is not None
    assert (pair["chosen"], pair["rejected"]) == expected
    assert pair["prompt"] == "<start_of_turn>user\nq<end_of_turn>\n<start_of_turn>model\n"


def test_best_against_worst_within_each_group() -> None:
    groups = {"a": [(0.0, "x"), (2.0, "y"), (1.0, "z")], "b": [(1.0, "u"), (1.0, "v")]}
    pairs = preferences.best_against_worst(groups, {"a": "PA", "b": "PB"}, margin=0.0)
    assert [(p["prompt"], p["chosen"], p["rejected"]) for p in pairs] == [("PA", "y", "x")]
    assert preferences.best_against_worst(groups, {"a": "PA", "b": "PB"}, margin=2.0) == []


def test_dpo_pairs_are_padded_the_way_tunix_expects() -> None:
    tokenizer = ByteTokenizer()
    pairs = [
        {"prompt": "ab", "chosen": "c", "rejected": "defgh"},
        {"prompt": "abcd", "chosen": "x", "rejected": "y"},
    ]
    records = dpo.tokenize_pairs(pairs, tokenizer, response_len=4)
    first = records[0]
    assert first["prompt_mask"].tolist() == [0, 0, 1, 1, 1]  # left-padded to the longest prompt
    assert first["prompt_ids"][-3:].tolist() == [tokenizer.bos_id(), *tokenizer.encode("ab")]
    assert first["chosen_mask"].tolist() == [1, 1, 0, 0]  # "c" + EOS, right-padded
    assert first["rejected_mask"].tolist() == [1, 1, 1, 1]  # truncated to response_len
    assert all(r["chosen_ids"].dtype == np.int32 for r in records)


def test_new_stage_hashes_move_with_config_and_inputs() -> None:
    from schemas.recipe import DPOConfig
    from tests.conftest import recipe_with

    model = recipe_with("/tmp/far-hash").model
    a, b = "a" * 64, "b" * 64
    pairs = [
        (
            hard_subset.identity(HardSubsetConfig(model="grpo"), a, a),
            hard_subset.identity(HardSubsetConfig(model="grpo", below=0.5), a, a),
            hard_subset.identity(HardSubsetConfig(model="grpo"), b, a),
        ),
        (
            self_teach.identity(SelfTeachConfig(), model, a, a),
            self_teach.identity(SelfTeachConfig(samples=8), model, a, a),
            self_teach.identity(SelfTeachConfig(), model, a, b),
        ),
        (
            dpo.identity(DPOConfig(max_steps=2), model, a, a),
            dpo.identity(DPOConfig(max_steps=2, algorithm="orpo"), model, a, a),
            dpo.identity(DPOConfig(max_steps=2), model, a, b),
        ),
    ]
    for base, other_config, other_input in pairs:
        assert len({base.digest, other_config.digest, other_input.digest}) == 3
