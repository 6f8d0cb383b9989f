"""Rewards: typed functions registered by name, shared by GRPO (as rewards) and evaluation
(as metrics).

Each reward scores a batch of completions against their references (answer and, for code,
tests). Pure ones are plain functions of one pair; the verifiers that must execute untrusted
text, SymPy on model-written math and MBPP tests on model-written code, run in the sandbox
(stages/rewards/sandbox.py), where a crash or timeout scores 0 and is counted, never raised.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stages.rewards.answers import extract_answer, unbox
from stages.rewards.sandbox import Limits, run_python

_STRICT_FORMAT = re.compile(
    r"^\s*<reasoning>(?P<reasoning>.+?)</reasoning>\s*<answer>(?P<answer>.+?)</answer>\s*"
    r"(?:<end_of_turn>\s*)?$",
    re.DOTALL,
)
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
_TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")


@dataclass(frozen=True)
class Reference:
    answer: str
    tests: tuple[str, ...] = ()


@dataclass
class SandboxStats:
    """Sandboxed verifications that crashed or timed out (scored 0, run continued)."""

    runs: int = 0
    failures: int = 0


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
    """1.0 when the completion is exactly <reasoning>...</reasoning><answer>...</answer>."""
    return 1.0 if _STRICT_FORMAT.match(completion) else 0.0


def format_approx(completion: str, ref: Reference) -> float:
    """0.25 per format tag that appears exactly once (partial credit while learning)."""
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
    predicted = extract_answer(completion)
    return 1.0 if predicted is not None and answers_equal(predicted, ref.answer) else 0.0


def reasoning_quality(completion: str, ref: Reference) -> float:
    """Trajectory shaping: reasoning present, in steps (up to 3 count), of sensible length."""
    match = re.search(r"<reasoning>(.*?)</reasoning>", completion, re.DOTALL)
    if not match or not match.group(1).strip():
        return 0.0
    text = match.group(1).strip()
    steps = len([s for s in re.split(r"\n+|(?<=[.;])\s+", text) if len(s.strip()) > 2])
    length = 1.0 if 10 <= len(text) <= 2000 else 0.5
    return round(min(steps, 3) / 3 * length, 6)


_SYMPY_CHECK = r"""
import json, re
from sympy import simplify
from sympy.parsing.sympy_parser import parse_expr, standard_transformations, \
    implicit_multiplication_application, convert_xor
T = standard_transformations + (implicit_multiplication_application, convert_xor)

def py(text):
    text = text.strip().strip("$").replace("\\left", "").replace("\\right", "")
    text = text.replace("\\cdot", "*").replace("\\times", "*").replace("\\pi", "pi")
    for _ in range(5):
        text = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", text)
        text = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", text)
    return text.replace("{", "(").replace("}", ")").replace("\\", "")

out = []
for a, b in json.loads(PAIRS):
    try:
        out.append(bool(simplify(parse_expr(py(a), transformations=T)
                                 - parse_expr(py(b), transformations=T)) == 0))
    except Exception:
        out.append(False)
print(NONCE + json.dumps(out))
"""
SYMPY_LIMITS = Limits(
    cpu_seconds=20,
    wall_seconds=30,
    site_packages=True,
    preload=("sympy", "sympy.parsing.sympy_parser"),
)


def symbolic_equal(pairs: Sequence[tuple[str, str]], stats: SandboxStats) -> list[bool]:
    """SymPy equivalence of (predicted, reference) pairs, in one sandboxed process."""
    if not pairs:
        return []
    nonce = secrets.token_hex(8)
    source = _SYMPY_CHECK.replace("PAIRS", repr(json.dumps(list(pairs)))).replace(
        "NONCE", repr(nonce)
    )
    result = run_python(source, SYMPY_LIMITS)
    stats.runs += 1
    line = result.stdout.strip().rsplit("\n", 1)[-1]
    if result.ok and line.startswith(nonce):
        return [bool(x) for x in json.loads(line[len(nonce) :])]
    stats.failures += 1
    return [False] * len(pairs)


def math_equivalent(
    completions: Sequence[str], refs: Sequence[Reference], stats: SandboxStats
) -> list[float]:
    """1.0 when the answer equals the reference numerically, or symbolically (SymPy)."""
    scores, pending = [], []
    for i, (completion, ref) in enumerate(zip(completions, refs, strict=True)):
        predicted = extract_answer(completion)
        equal = predicted is not None and answers_equal(predicted, ref.answer)
        scores.append(1.0 if equal else 0.0)
        if predicted is not None and not equal:
            pending.append((i, predicted, ref.answer))
    verdicts = symbolic_equal([(p, r) for _, p, r in pending], stats)
    for (i, _, _), same in zip(pending, verdicts, strict=True):
        scores[i] = 1.0 if same else 0.0
    return scores


def extract_code(completion: str) -> str:
    """The code in the answer (or the whole completion), without markdown fences."""
    text = extract_answer(completion) if "<answer>" in completion else completion
    fenced = _FENCE.search(text or "")
    return (fenced.group(1) if fenced else text or "").strip()


CODE_LIMITS = Limits(cpu_seconds=5, wall_seconds=10, memory_bytes=512 << 20)


def run_tests(code: str, tests: Sequence[str], stats: SandboxStats) -> float:
    """Fraction of tests that pass, each in its own sandboxed process after the code."""
    try:
        compile(code, "<completion>", "exec")  # syntax check only: nothing executes here
    except (SyntaxError, ValueError):
        return 0.0
    passed = 0
    for test in tests:
        nonce = secrets.token_hex(8)
        result = run_python(f"{code}\n\n{test}\nprint({nonce!r})\n", CODE_LIMITS)
        stats.runs += 1
        if result.ok and result.stdout.rstrip().endswith(nonce):
            passed += 1
        elif not result.ok and (result.timed_out or result.returncode not in (1,)):
            stats.failures += 1
    return passed / len(tests) if tests else 0.0


def code_pass_rate(
    completions: Sequence[str], refs: Sequence[Reference], stats: SandboxStats
) -> list[float]:
    """Pass fraction of the reference tests (MBPP, HumanEval) run in the sandbox."""
    return [
        run_tests(extract_code(c), r.tests, stats) for c, r in zip(completions, refs, strict=True)
    ]


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


def references(answers: Sequence[Any], tests: Sequence[Any] | None = None) -> list[Reference]:
    """References from batch fields (tests travel JSON-encoded through Tunix's numpy batch)."""
    encoded = tests if tests is not None else ["[]"] * len(answers)
    return [
        Reference(str(a), tuple(json.loads(str(t)))) for a, t in zip(answers, encoded, strict=True)
    ]


def tunix_reward_fns(
    weights: dict[str, float], stats: SandboxStats | None = None
) -> list[Callable[..., list[float]]]:
    """Batch callables in Tunix's shape: fn(prompts, completions, answer, tests, **kw)."""
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
            scores = _reward.score(completions, references(answer, tests), counted)
            return [_weight * s for s in scores]

        batch_fn.__name__ = name
        fns.append(batch_fn)
    return fns
