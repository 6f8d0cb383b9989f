"""Each registered reward, table-driven; the registry refuses unknown names."""

from __future__ import annotations

import numpy as np
import pytest

from stages import rewards

FORMAT_CASES = [
    ("<reasoning>3 + 4 = 7</reasoning><answer>7</answer>", 1.0),
    ("<reasoning>a</reasoning>\n<answer>7</answer><end_of_turn>", 1.0),
    ("  <reasoning>multi\nline</reasoning><answer>x</answer>  ", 1.0),
    ("<answer>7</answer>", 0.0),
    ("<reasoning>3+4</reasoning>", 0.0),
    ("<reasoning></reasoning><answer>7</answer>", 0.0),  # empty reasoning is no reasoning
    ("The answer is <reasoning>x</reasoning><answer>7</answer>", 0.0),  # text before
    ("<reasoning>x</reasoning><answer>7</answer> and more", 0.0),  # text after
    ("<answer>7</answer><reasoning>x</reasoning>", 0.0),  # wrong order
    ("", 0.0),
]


@pytest.mark.parametrize(("completion", "expected"), FORMAT_CASES)
def test_format_strict(completion: str, expected: float) -> None:
    assert rewards.format_strict(completion, "7") == expected


ANSWER_CASES = [
    ("<reasoning>r</reasoning><answer>7</answer>", "7", 1.0),
    ("<answer> 7 </answer>", "7", 1.0),
    ("<answer>7.0</answer>", "7", 1.0),
    ("<answer>-3</answer>", "-3", 1.0),
    ("<answer>1,000</answer>", "1000", 1.0),
    ("<answer>0.5</answer>", ".5", 1.0),
    ("<answer>8</answer>", "7", 0.0),
    ("<answer>seven</answer>", "7", 0.0),
    ("7", "7", 0.0),  # no answer tag: nothing to extract
    ("<answer>7</answer><answer>8</answer>", "7", 1.0),  # first answer counts
    ("<answer>__import__('os')</answer>", "7", 0.0),  # text is compared, never evaluated
]


@pytest.mark.parametrize(("completion", "answer", "expected"), ANSWER_CASES)
def test_answer_match(completion: str, answer: str, expected: float) -> None:
    assert rewards.answer_match(completion, answer) == expected


def test_unknown_reward_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown reward 'speed'.*answer_match.*format_strict"):
        rewards.tunix_reward_fns({"speed": 1.0})


def test_tunix_batch_functions_weight_and_align() -> None:
    fns = rewards.tunix_reward_fns({"format_strict": 0.5, "answer_match": 2.0})
    completions = ["<reasoning>r</reasoning><answer>7</answer>", "<answer>8</answer>"]
    answers = np.asarray(["7", "7"])
    kwargs = {"prompts": ["p", "p"], "completions": completions, "answer": answers}
    assert [fn.__name__ for fn in fns] == ["format_strict", "answer_match"]
    assert fns[0](**kwargs) == [0.5, 0.0]
    assert fns[1](**kwargs) == [2.0, 0.0]
