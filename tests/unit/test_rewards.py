"""Each registered reward, table-driven; sandboxed verifiers on honest and hostile input."""

from __future__ import annotations

import sys
from typing import ClassVar

import numpy as np
import pytest
from pydantic import ValidationError

from schemas.recipe import REWARD_PRESETS, GRPOConfig
from stages import rewards
from stages.rewards import Reference, SandboxStats, answers

R7 = Reference("7")

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
    ("<reasoning>x</reasoning>\n<answer>7</answer>\n<end_of_turn>\n", 1.0),
    ("<reasoning>a < b, so 7</reasoning><answer>7</answer>", 1.0),  # a lone '<' is text
]
# Each scored 1.0 before the strict format: the lazy match ran on to the last closing tag
NOT_STRICT = [
    "<reasoning>x</reasoning><answer>7</answer> junk <answer>8</answer>",  # a second answer
    "<reasoning>x</reasoning><answer>7</answer>\nQ: next?\n<answer>8</answer><end_of_turn>",
    "<reasoning>x</reasoning></reasoning><answer>7</answer>",  # a stray extra </reasoning>
    "<reasoning>x</reasoning>\n</reasoning>\n<answer>7</answer>",
    "<reasoning>x</reasoning><answer>7</answer></answer>",
    "<reasoning>x</reasoning><answer>7</answer><end_of_turn>\n<answer>8</answer>",
    "<reasoning>a <answer>6</answer></reasoning><answer>7</answer>",  # tags inside reasoning
    "<reasoning><reasoning>x</reasoning><answer>7</answer>",
    "<reasoning>x</reasoning><answer>7</answer><end_of_turn><end_of_turn>",
    "<reasoning>x<end_of_turn></reasoning><answer>7</answer>",  # the turn ended mid-way
]


@pytest.mark.parametrize(("completion", "expected"), FORMAT_CASES)
def test_format_strict(completion: str, expected: float) -> None:
    assert rewards.format_strict(completion, R7) == expected


@pytest.mark.parametrize("completion", NOT_STRICT)
def test_format_strict_wants_each_tag_once_and_nothing_after_the_answer(completion: str) -> None:
    assert rewards.format_strict(completion, R7) == 0.0


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<reasoning>x</reasoning><answer>7</answer>", 1.0),
        ("<reasoning>x</reasoning>", 0.5),
        ("<reasoning>x", 0.25),
        ("<answer>1</answer><answer>2</answer>", 0.0),
        ("plain", 0.0),
    ],
)
def test_format_approx(completion: str, expected: float) -> None:
    assert rewards.format_approx(completion, R7) == expected


@pytest.mark.parametrize(
    ("completion", "extracted"),
    [
        ("<answer> 42 </answer>", "42"),
        ("so #### 1,200\n", "1,200"),
        ("the area is $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),
        ("no answer here", None),
        ("<answer>a</answer> #### b", "a"),
    ],
)
def test_extract_answer(completion: str, extracted: str | None) -> None:
    assert answers.extract_answer(completion) == extracted


ANSWER_CASES = [
    ("<reasoning>r</reasoning><answer>7</answer>", "7", 1.0),
    ("<answer> 7 </answer>", "7", 1.0),
    ("<answer>7.0</answer>", "7", 1.0),
    ("<answer>-3</answer>", "-3", 1.0),
    ("<answer>1,000</answer>", "1000", 1.0),
    ("<answer>$18</answer>", "18", 1.0),
    ("<answer>0.5</answer>", ".5", 1.0),
    ("<answer>8</answer>", "7", 0.0),
    ("<answer>seven</answer>", "7", 0.0),
    ("7", "7", 0.0),  # no answer to extract
    ("#### 7", "7", 1.0),
    ("<answer>7</answer><answer>8</answer>", "7", 1.0),  # the first answer counts
    ("<answer>__import__('os')</answer>", "7", 0.0),  # compared as text, never evaluated
]


@pytest.mark.parametrize(("completion", "answer", "expected"), ANSWER_CASES)
def test_answer_match(completion: str, answer: str, expected: float) -> None:
    assert rewards.answer_match(completion, Reference(answer)) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<reasoning>3 + 4 = 7. So 7.\nDone.</reasoning><answer>7</answer>", 1.0),
        ("<reasoning>3 + 4 = 7 apples</reasoning><answer>7</answer>", round(1 / 3, 6)),
        ("<reasoning>7</reasoning><answer>7</answer>", 0.0),
        ("<reasoning></reasoning><answer>7</answer>", 0.0),
        ("<answer>7</answer>", 0.0),
    ],
)
def test_reasoning_quality(completion: str, expected: float) -> None:
    assert rewards.reasoning_quality(completion, R7) == pytest.approx(expected)


MATH_CASES = [  # (completion, reference, expected): numeric first, math-verify (sandboxed) next
    ("<answer>0.5</answer>", "1/2", 1.0),
    ("<answer>\\frac{1}{2}</answer>", "0.5", 1.0),
    ("<answer>2\\sqrt{2}</answer>", "\\sqrt{8}", 1.0),
    ("<answer>x^2 + 2x + 1</answer>", "(x+1)^2", 1.0),
    ("<answer>\\frac{3}{4}</answer>", "0.7", 0.0),
    ("<answer>\\frac34</answer>", "\\frac{3}{4}", 1.0),
    ("<answer>(1,2)</answer>", "(1, 2)", 1.0),
    ("<answer>x=5</answer>", "5", 1.0),
    ("<answer>[0,\\infty)</answer>", "[0, \\infty)", 1.0),
    ("<answer>\\{3, 1, 2\\}</answer>", "\\{1,2,3\\}", 1.0),
    ("The answer is $\\boxed{\\dfrac{\\pi}{2}}$", "\\frac{\\pi}{2}", 1.0),
    ("<answer>42</answer>", "17", 0.0),
    ("<answer>__import__('os').system('true')</answer>", "1", 0.0),  # evaluated only inside
    ("no answer", "1", 0.0),
    ("<answer>8</answer>", "7", 0.0),  # decided numerically, no sandbox
    ("<answer>seven</answer>", "7", 0.0),  # no digit against a number: no sandbox
    ("<answer>\\frac{14}{2}</answer>", "7", 1.0),
]


@pytest.mark.slow  # ~10 answers x 2 sandboxes, each importing SymPy and math-verify
def test_math_equivalent_table() -> None:
    stats = SandboxStats()
    completions = [c for c, _, _ in MATH_CASES]
    refs = [Reference(r) for _, r, _ in MATH_CASES]
    assert rewards.math_equivalent(completions, refs, stats) == [e for _, _, e in MATH_CASES]
    assert stats.runs >= 10  # each non-numeric answer: its own parse and verify sandboxes


class ProcessesStarted:
    """Every process this interpreter starts, seen through Python's own audit hook for
    `subprocess.Popen` (the way every sandbox starts, bwrap or a child interpreter): a real
    count, not a stand-in for the sandbox. An audit hook cannot be removed, so one is added
    once and counts only while a `with` block of some instance is open."""

    _open: ClassVar[list[list[str]]] = []
    _hooked: ClassVar[bool] = False

    def __init__(self) -> None:
        self.started: list[str] = []
        if not ProcessesStarted._hooked:
            sys.addaudithook(ProcessesStarted._hook)
            ProcessesStarted._hooked = True

    @staticmethod
    def _hook(event: str, args: tuple) -> None:
        if event == "subprocess.Popen":
            for started in ProcessesStarted._open:
                started.append(str(args[0]))

    def __enter__(self) -> list[str]:
        ProcessesStarted._open.append(self.started)
        return self.started

    def __exit__(self, *_: object) -> None:
        ProcessesStarted._open.remove(self.started)


TEXT_CASES = [  # (completion, text reference, expected): decided here, by plain comparison
    ("<answer>olleh</answer>", "olleh", 1.0),
    ("<answer>hello</answer>", "olleh", 0.0),  # an anagram: math-verify read both as h*e*l*l*o
    ("<answer>Paris</answer>", "paris", 0.0),  # SymPy's product of letters ignored the case
    ("<answer>yes</answer>", "no", 0.0),
    ("<answer>act</answer>", "cat", 0.0),
    ("<answer>B</answer>", "A", 0.0),
    ("<answer>the red fox</answer>", "the red fox", 1.0),
    ("<answer>7</answer>", "seven", 0.0),
]


def test_text_answers_start_no_sandbox_and_are_not_anagrams() -> None:
    completions = [c for c, _, _ in TEXT_CASES] * 3
    refs = [Reference(r) for _, r, _ in TEXT_CASES] * 3
    stats = SandboxStats()  # bwrap, as a recipe has it
    with ProcessesStarted() as started:
        scores = rewards.math_equivalent(completions, refs, stats)
    assert scores == [e for _, _, e in TEXT_CASES] * 3
    assert started == [] and stats.runs == 0
    assert [rewards.math_grading.is_text_answer(r) for r in ("x^2", "\\pi", "2", "(a, b)")] == [
        False
    ] * 4
    # the hook sees the sandbox where mathematics needs it: one parse, one verify
    math = SandboxStats("process")
    with ProcessesStarted() as started:
        assert rewards.math_equivalent(["<answer>\\frac{1}{2}</answer>"], [Reference("0.5")], math)
    assert len(started) == 2 and math.runs == 2


ADD_TESTS = ("assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4")
CODE_CASES = [  # (answer code, expected pass fraction)
    ("def add(a, b):\n    return a + b", 1.0),
    ("```python\ndef add(a, b):\n    return a + b\n```", 1.0),
    ("def add(a, b):\n    return 3", 1 / 3),
    ("def add(a, b) return a + b", 0.0),  # syntax error: nothing runs
    # os.system is refused by seccomp (it returns an error status); add itself is right
    ("import os\nos.system('rm -rf /tmp/x')\ndef add(a, b):\n    return a + b", 1.0),
    ("while True:\n    pass", 0.0),  # timeout
    # a call over its CPU limit fails alone; the calls after it still run
    ("def add(a, b):\n    while a == 1:\n        pass\n    return a + b", 2 / 3),
    ("import os\nwhile True:\n    os.fork()", 0.0),  # fork bomb
    ("x = bytearray(8 << 30)", 0.0),  # memory bomb
    ("import socket\nsocket.create_connection(('127.0.0.1', 22))", 0.0),
    ("import os\ndef add(a, b):\n    os._exit(0)", 0.0),  # faking success by exiting early
    ("import sys\nprint('x' * 10**8, file=sys.stderr)", 0.0),  # huge output
    ("def add(a, b):\n    return float(a + b)", 1.0),  # 3.0 == 3, as Python's assert has it
    ("import os\nos.abort()", 0.0),  # the sandbox dies: a counted failure
]


def test_a_counter_arrives_as_the_dict_it_holds() -> None:
    tests = ("assert f([1, 1, 2]) == {1: 2, 2: 1}",)
    code = "from collections import Counter\ndef f(x):\n    return Counter(x)"
    assert rewards.code_pass_rate([code], [Reference("", tests)], SandboxStats()) == [1.0]


def test_code_pass_rate_table() -> None:
    stats = SandboxStats()
    completions = [f"<reasoning>r</reasoning><answer>{c}</answer>" for c, _ in CODE_CASES]
    refs = [Reference("", ADD_TESTS)] * len(CODE_CASES)
    scores = rewards.code_pass_rate(completions, refs, stats)
    assert scores == pytest.approx([e for _, e in CODE_CASES])
    assert stats.runs == len(CODE_CASES)  # one sandbox per completion, all its calls inside
    assert stats.failures == 1  # the aborted one; the others were refused or timed out inside
    assert stats.ungradable == 0


def test_ungradable_tests_score_zero_and_are_counted() -> None:
    stats = SandboxStats()
    tests = ("assert add(1, 2) == 3", "for i in range(3):\n    assert add(i, 0) == i")
    scores = rewards.code_pass_rate(
        ["def add(a, b):\n    return a + b"], [Reference("", tests)], stats
    )
    assert scores == [0.5] and stats.ungradable == 1


def test_isolation_metrics_name_the_level() -> None:
    assert rewards.isolation_metrics(SandboxStats("bwrap"))["sandbox_isolation_bwrap"] == 1.0
    assert rewards.isolation_metrics(SandboxStats("process"))["sandbox_isolation_bwrap"] == 0.0


def test_unknown_reward_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown reward 'speed'.*answer_match.*format_strict"):
        rewards.tunix_reward_fns({"speed": 1.0})


def test_tunix_batch_functions_weight_and_align() -> None:
    fns = rewards.tunix_reward_fns({"format_strict": 0.5, "answer_match": 2.0})
    completions = ["<reasoning>r</reasoning><answer>7</answer>", "<answer>8</answer>"]
    kwargs = {
        "prompts": ["p", "p"],
        "completions": completions,
        "answer": np.asarray(["7", "7"]),
        "tests": np.asarray(["[]"] * 2),
    }
    assert [fn.__name__ for fn in fns] == ["format_strict", "answer_match"]
    assert fns[0](**kwargs) == [0.5, 0.0]
    assert fns[1](**kwargs) == [2.0, 0.0]


def test_presets_name_registered_rewards() -> None:
    for weights in REWARD_PRESETS.values():
        rewards.validate_names(weights)
        assert sum(weights.values()) == pytest.approx(1.0)


def test_a_recipe_asks_for_a_preset_by_name() -> None:
    config = GRPOConfig(
        max_steps=1, batch_size=1, rewards={"preset": "trajectory_60_correctness_40"}
    )
    assert config.rewards == REWARD_PRESETS["trajectory_60_correctness_40"]
    with pytest.raises(ValidationError, match="unknown reward preset 'nope'; presets: "):
        GRPOConfig(max_steps=1, batch_size=1, rewards={"preset": "nope"})
