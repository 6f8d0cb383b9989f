"""FAR's own rewards, registered the way a plugin's are (`@reward`): the format checks, the
answer comparisons (plain, then math-verify in the sandbox), the code tests (run sandboxed,
judged here) and the `random` negative control. Each is a plain function that can be called
and tested directly; their stage's STAGE_VERSION covers their code."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

from schemas.recipe import AnswerFormat
from stages.rewards.answers import (
    approx_format,
    extract_answer,
    reasoning_text,
    strict_format,
    unbox,
)
from stages.rewards.code_harness import CpuLimits, harness, read_results
from stages.rewards.code_tests import Check, Ungradable, imports_of, parse_test, passes
from stages.rewards.math_grading import MathRuns, is_text_answer, symbolic_verdicts
from stages.rewards.references import Reference
from stages.rewards.registry import reward
from stages.rewards.sandbox import SandboxResult
from stages.rewards.sandboxing import SandboxStats, run_sandboxed

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


@reward("format_strict")
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


@reward("format_approx")
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


@reward("answer_match")
def answer_match(completion: str, ref: Reference) -> float:
    """1.0 when the extracted answer equals the reference (numerically or as text)."""
    predicted = extract_answer(completion, ref.answer_format)
    return 1.0 if predicted is not None and answers_equal(predicted, ref.answer) else 0.0


@reward("reasoning_quality")
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
    """False when the plain comparison already decided: a plain-number reference against a
    plain number, or against text without a single digit, or a text reference (no sandbox
    needed for those)."""
    p, r = (x.strip().replace(",", "").replace("$", "") for x in (predicted, reference))
    if is_text_answer(r):
        return False
    if not _NUMBER.match(r):
        return True
    return not _NUMBER.match(unbox(p)) and any(c.isdigit() for c in p)


@reward("math_equivalent", batch=True)
def math_equivalent(
    completions: Sequence[str], refs: Sequence[Reference], stats: SandboxStats
) -> list[float]:
    """1.0 when the answer equals the reference numerically or as text, else by math-verify
    (sandboxed); a text reference (`is_text_answer`) is decided by the comparison alone."""
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
    tagged = answer_format in ("tags", "answer") and "<answer>" in completion
    text = extract_answer(completion) if tagged else completion
    fenced = _FENCE.search(text or "")
    return (fenced.group(1) if fenced else text or "").strip()


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


@reward("code_pass_rate", batch=True)
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
    for i, result in zip(owners, run_sandboxed(sources, stats), strict=True):
        results[i] = result
    return [_score_tests(checks, result) for checks, result in zip(plans, results, strict=True)]


RANDOM_REWARD_SEED = 0
"""Salts the `random` reward's draws (a fixed number: the same draws in every run)."""


def random_draw(prompt: str, sample: int, seed: int = RANDOM_REWARD_SEED) -> float:
    """0.0 or 1.0 with even odds: the low bit of sha256(seed, prompt, sample index)."""
    digest = hashlib.sha256(f"{seed}\x00{sample}\x00{prompt}".encode()).digest()
    return float(digest[-1] & 1)


@reward("random", batch=True)
def random_reward(
    completions: Sequence[str], refs: Sequence[Reference], stats: SandboxStats
) -> list[float]:
    """The negative control: 0 or 1 with even odds, independent of the completion's text and
    of the answer. Each completion's draw is decided by its prompt and its index among the
    batch's completions of that prompt (its place in the group), so a run that resumes, given
    the same prompts in the same order, draws the same rewards bit for bit."""
    seen: dict[str, int] = {}
    out = []
    for ref in refs:
        index = seen.get(ref.prompt, 0)
        seen[ref.prompt] = index + 1
        out.append(random_draw(ref.prompt, index))
    return out
