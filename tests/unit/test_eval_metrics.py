"""Evaluation metrics on fixed completions, table-driven (no model involved)."""

from __future__ import annotations

import pytest

from stages.evaluate import evaluation as evaluate

MATH = {"id": "m", "domain": "math", "answer": "6", "tests": []}
CODE = {"id": "c", "domain": "code", "answer": "", "tests": ["assert double(3) == 6"]}
GOOD_CODE = "<reasoning>r</reasoning><answer>def double(x):\n    return 2 * x</answer>"
BAD_CODE = "<reasoning>r</reasoning><answer>def double(x):\n    return x</answer>"


@pytest.mark.parametrize(
    ("completions", "k", "expected"),
    [
        (["<answer>6</answer>", "<answer>6</answer>", "<answer>5</answer>"], 3, 1.0),
        (["<answer>5</answer>", "<answer>5</answer>", "<answer>6</answer>"], 3, 0.0),
        (["no answer", "no answer", "<answer>6.0</answer>"], 3, 1.0),
        (["no answer"], 1, 0.0),
    ],
)
def test_majority_vote(completions: list[str], k: int, expected: float) -> None:
    assert evaluate.majority_accuracy([MATH], completions, k) == expected


def test_scores_per_domain_pass_at_k_and_samples() -> None:
    rows = [MATH, CODE]
    completions = [  # prompt-major, 2 samples each
        "<reasoning>3 * 2 = 6</reasoning><answer>6</answer>",
        "<answer>7</answer>",
        GOOD_CODE,
        BAD_CODE,
    ]
    scores, samples = evaluate.score("m1", None, rows, completions, samples=2)
    assert scores.num_prompts == 2 and len(samples) == 4
    assert scores.accuracy == 0.5  # 1 of 2 math samples, 1 of 2 code samples
    assert scores.metrics["pass@1"] == 0.5 and scores.metrics["pass@2"] == 1.0
    assert scores.format_rate == 0.75
    assert scores.by_domain["math"] == {"n": 1.0, "format_rate": 0.5, "accuracy": 0.5}
    assert scores.by_domain["code"]["accuracy"] == 0.5
    assert [s["correct"] for s in samples] == [1.0, 0.0, 1.0, 0.0]


def test_symbolic_answers_count_as_correct_but_not_exact() -> None:
    row = {**MATH, "answer": "1/2"}
    scores, _ = evaluate.score("m", None, [row], ["<answer>\\frac{1}{2}</answer>"], samples=1)
    assert scores.accuracy == 1.0 and scores.metrics["exact_accuracy"] == 0.0
