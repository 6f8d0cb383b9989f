"""Rewards: typed functions registered by name, shared by GRPO (as rewards) and evaluation
(as metrics).

Each reward scores a batch of completions against their references (answer and, for code,
tests). Pure ones are plain functions of one pair; the verifiers that must execute untrusted
text, math-verify on model-written math (stages/rewards/math_grading.py) and MBPP/HumanEval
tests on model-written code (stages/rewards/code_tests.py), run in the sandbox
(stages/rewards/sandbox.py). The sandbox only computes; every verdict is decided here from
plain data, and a crash, refusal or timeout scores 0 and is counted, never raised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from schemas.recipe import AnswerFormat
from stages.rewards.answers import (
    approx_format,
    extract_answer,
    reasoning_text,
    strict_format,
    unbox,
)
from stages.rewards.code_tests import (
    Check,
    CpuLimits,
    Ungradable,
    harness,
    imports_of,
    parse_test,
    passes,
    read_results,
)
from stages.rewards.math_grading import MathRuns, symbolic_verdicts
from stages.rewards.sandbox import Isolation, Limits, SandboxResult, missing_isolation, run_many

# With each tag counted once (format_strict), the lazy groups cannot run past a second tag
_STRICT_FORMAT = re.compile(
    r"^\s*<reasoning>(?P<reasoning>.+?)</reasoning>\s*<answer>(?P<answer>.+?)</answer>\s*"
    r"(?:<end_of_turn>\s*)?$",
    re.DOTALL,
)
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
_TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
_END_OF_TURN = "<end_of_turn>"


@dataclass(frozen=True)
class Reference:
    answer: str
    tests: tuple[str, ...] = ()
    answer_format: AnswerFormat = "tags"  # where the completion should put it (the dataset's)


@dataclass
class SandboxStats:
    """Where sandboxed verifications run (isolation level, pool size) and how they went:
    processes started (or that the host could not start), crashed or timed out (all scored 0,
    the run continued), and tests whose shape cannot be graded safely (scored 0)."""

    isolation: Isolation = "bwrap"
    workers: int | None = None  # sandboxes at a time; None: one per CPU
    runs: int = 0
    failures: int = 0
    ungradable: int = 0


@dataclass(frozen=True)
class Reward:
    name: str
    score: Callable[[Sequence[str], Sequence[Reference], SandboxStats], list[float]]
    doc: str


def _pairwise(fn: Callable[[str, Reference], float]) -> Callable[..., list[float]]:
    def score(
        completions: Sequence[str], refs: Sequence[Reference], _: SandboxStats
    ) -> list[float]:
        return [fn(c, r) for c, r in zip(completions, refs, strict=True)]

    return score


def format_strict(completion: str, ref: Reference) -> float:
    """1.0 when the completion is exactly <reasoning>...</reasoning><answer>...</answer>: each
    tag once, nothing after the answer but the end-of-turn marker (and whitespace). Under the
    hashes or boxed answer format: reasoning, then one `#### answer` last line or one
    `\\boxed{answer}` at the end (stages/rewards/answers.py)."""
    if ref.answer_format != "tags":
        return 1.0 if strict_format(completion, ref.answer_format) else 0.0
    match = _STRICT_FORMAT.match(completion)
    if match is None or any(completion.count(tag) != 1 for tag in _TAGS):
        return 0.0
    return 0.0 if _END_OF_TURN in match["reasoning"] + match["answer"] else 1.0


def format_approx(completion: str, ref: Reference) -> float:
    """0.25 per format tag that appears exactly once (partial credit while learning); under
    hashes or boxed, 0.5 for the marker once, 0.25 each for reasoning and a final answer."""
    if ref.answer_format != "tags":
        return approx_format(completion, ref.answer_format)
    return sum(0.25 for tag in _TAGS if completion.count(tag) == 1)


def answers_equal(predicted: str, reference: str) -> bool:
    """Numeric comparison when both parse as numbers (1e-6 relative), else exact text."""
    p, r = (x.strip().replace(",", "").replace("$", "") for x in (predicted, reference))
    p = unbox(p)
    if _NUMBER.match(p) and _NUMBER.match(r):
        a, b = float(p), float(r)
        return abs(a - b) <= 1e-6 * max(1.0, abs(b))
    return p == r


def answer_match(completion: str, ref: Reference) -> float:
    """1.0 when the extracted answer equals the reference (numerically or as text)."""
    predicted = extract_answer(completion, ref.answer_format)
    return 1.0 if predicted is not None and answers_equal(predicted, ref.answer) else 0.0


def reasoning_quality(completion: str, ref: Reference) -> float:
    """Trajectory shaping: reasoning present, in steps (up to 3 count), of sensible length."""
    found = reasoning_text(completion, ref.answer_format)
    if not found or not found.strip():
        return 0.0
    text = found.strip()
    steps = len([s for s in re.split(r"\n+|(?<=[.;])\s+", text) if len(s.strip()) > 2])
    length = 1.0 if 10 <= len(text) <= 2000 else 0.5
    return round(min(steps, 3) / 3 * length, 6)


def _worth_verifying(predicted: str, reference: str) -> bool:
    """False when the numeric comparison already decided: a plain-number reference against a
    plain number, or against text without a single digit (no sandbox needed for those)."""
    p, r = (x.strip().replace(",", "").replace("$", "") for x in (predicted, reference))
    if not _NUMBER.match(r):
        return True
    return not _NUMBER.match(unbox(p)) and any(c.isdigit() for c in p)


def math_equivalent(
    completions: Sequence[str], refs: Sequence[Reference], stats: SandboxStats
) -> list[float]:
    """1.0 when the answer equals the reference numerically, else by math-verify (sandboxed)."""
    scores, pending = [], []
    for i, (completion, ref) in enumerate(zip(completions, refs, strict=True)):
        predicted = extract_answer(completion, ref.answer_format)
        equal = predicted is not None and answers_equal(predicted, ref.answer)
        scores.append(1.0 if equal else 0.0)
        if predicted is not None and not equal and _worth_verifying(predicted, ref.answer):
            pending.append((i, predicted, ref.answer))
    runs = MathRuns()
    pairs = [(p, r) for _, p, r in pending]
    verdicts = symbolic_verdicts(pairs, stats.isolation, runs, stats.workers)
    stats.runs += runs.runs
    stats.failures += runs.failures
    for (i, _, _), same in zip(pending, verdicts, strict=True):
        scores[i] = 1.0 if same else 0.0
    return scores


def extract_code(completion: str, answer_format: AnswerFormat = "tags") -> str:
    """The code in the answer tag (or the whole completion), without markdown fences."""
    tagged = answer_format == "tags" and "<answer>" in completion
    text = extract_answer(completion) if tagged else completion
    fenced = _FENCE.search(text or "")
    return (fenced.group(1) if fenced else text or "").strip()


CODE_LIMITS = Limits(cpu_seconds=5, wall_seconds=15, memory_bytes=512 << 20)
CALL_SECONDS = 2.0  # CPU for each call of a test, and for the candidate's own top-level code
# What the parent accepts, in CPU seconds of the whole sandbox as the kernel counts them:
# starting (~0.03 s) and the top-level code, then each call; the margin covers starting and
# the parent reading a line a moment late (the in-sandbox alarm stops honest code at
# CALL_SECONDS of CPU; one that dodges it is judged by these numbers alone)
CODE_CPU = CpuLimits(start_seconds=CALL_SECONDS + 0.25, call_seconds=CALL_SECONDS + 0.25)


def _test_checks(tests: Sequence[str], stats: SandboxStats) -> list[list[Check] | None]:
    """The checks of each test; None (counted as ungradable) where its shape is not safe."""
    found: list[list[Check] | None] = []
    for test in tests:
        try:
            found.append(parse_test(test))
        except Ungradable:
            stats.ungradable += 1
            found.append(None)
    return found


def _score_tests(checks: list[list[Check] | None], result: SandboxResult | None) -> float:
    flat = [c for group in checks if group for c in group]
    if result is None:
        returned: list[tuple[bool, Any]] = []
    else:
        returned = read_results(result.stdout, len(flat), result.line_cpu, CODE_CPU)
    passed, position = 0, 0
    for group in checks:
        if not group:
            continue
        outcomes = returned[position : position + len(group)]
        position += len(group)
        passed += all(passes(c, *o) for c, o in zip(group, outcomes, strict=True))
    return passed / len(checks) if checks else 0.0


def code_pass_rate(
    completions: Sequence[str], refs: Sequence[Reference], stats: SandboxStats
) -> list[float]:
    """Fraction of the reference tests (MBPP, HumanEval) passed: the calls run sandboxed, one
    sandbox per completion (a pool of them at a time), the verdicts are decided here."""
    plans = [_test_checks(r.tests, stats) for r in refs]
    sources, owners = [], []
    for i, (completion, ref, checks) in enumerate(zip(completions, refs, plans, strict=True)):
        calls = [c.expression for group in checks if group for c in group]
        if calls:
            code = extract_code(completion, ref.answer_format)
            sources.append(harness(code, imports_of(ref.tests), calls, CALL_SECONDS))
            owners.append(i)
    results: list[SandboxResult | None] = [None] * len(completions)
    ran = run_many(sources, CODE_LIMITS, stats.isolation, stats.workers)
    for i, result in zip(owners, ran, strict=True):
        results[i] = result
        stats.runs += 1
        stats.failures += 0 if result.ok else 1
    return [_score_tests(checks, result) for checks, result in zip(plans, results, strict=True)]


REGISTRY: dict[str, Reward] = {
    r.name: r
    for r in (
        Reward("format_strict", _pairwise(format_strict), format_strict.__doc__ or ""),
        Reward("format_approx", _pairwise(format_approx), format_approx.__doc__ or ""),
        Reward("answer_match", _pairwise(answer_match), answer_match.__doc__ or ""),
        Reward("reasoning_quality", _pairwise(reasoning_quality), reasoning_quality.__doc__ or ""),
        Reward("math_equivalent", math_equivalent, math_equivalent.__doc__ or ""),
        Reward("code_pass_rate", code_pass_rate, code_pass_rate.__doc__ or ""),
    )
}


def get_reward(name: str) -> Reward:
    if name not in REGISTRY:
        raise ValueError(f"unknown reward {name!r}; registered rewards: {sorted(REGISTRY)}")
    return REGISTRY[name]


def validate_names(weights: dict[str, float]) -> None:
    for name in weights:
        get_reward(name)


def references(
    answers: Sequence[Any],
    tests: Sequence[Any] | None = None,
    answer_format: AnswerFormat = "tags",
) -> list[Reference]:
    """References from batch fields (tests travel JSON-encoded through Tunix's numpy batch),
    graded in `answer_format` (the dataset's)."""
    encoded = tests if tests is not None else ["[]"] * len(answers)
    return [
        Reference(str(a), tuple(json.loads(str(t))), answer_format)
        for a, t in zip(answers, encoded, strict=True)
    ]


def isolation_metrics(stats: SandboxStats) -> dict[str, float]:
    """The isolation level (1.0: bwrap, 0.0: process) and ungradable tests, as record metrics."""
    return {
        "sandbox_isolation_bwrap": 1.0 if stats.isolation == "bwrap" else 0.0,
        "sandbox_ungradable": float(stats.ungradable),
    }


class IsolationUnavailable(RuntimeError):
    """The recipe's sandbox isolation level cannot be had on this machine."""


def require_isolation(isolation: Isolation) -> None:
    """Refuse (before any stage starts) a run whose sandbox this machine cannot give."""
    missing = missing_isolation(isolation)
    if missing is not None:
        raise IsolationUnavailable(
            f"the recipe's rewards and evaluation run model-written code and math in a sandbox "
            f"with isolation {isolation!r}, which this machine cannot give: {missing}. Install "
            f"bubblewrap (make env does as root), or accept the weaker isolation explicitly "
            f"in the recipe with `sandbox: {{isolation: process}}` (a child interpreter that "
            f"model-written code can escape; for trusted models only)"
        )


def tunix_reward_fns(
    weights: dict[str, float],
    stats: SandboxStats | None = None,
    answer_format: AnswerFormat = "tags",
) -> list[Callable[..., list[float]]]:
    """Batch callables in Tunix's shape: fn(prompts, completions, answer, tests, **kw),
    grading in `answer_format` (the dataset's)."""
    validate_names(weights)
    counted = stats if stats is not None else SandboxStats()
    fns = []
    for name, weight in weights.items():
        reward = get_reward(name)

        def batch_fn(
            prompts: Sequence[str],
            completions: Sequence[str],
            answer: Sequence[Any],
            tests: Sequence[Any] | None = None,
            _reward: Reward = reward,
            _weight: float = weight,
            **_: Any,
        ) -> list[float]:
            refs = references(answer, tests, answer_format)
            scores = _reward.score(completions, refs, counted)
            return [_weight * s for s in scores]

        batch_fn.__name__ = name
        fns.append(batch_fn)
    return fns
