"""Rewards: pure, typed functions of one completion, registered by name.

A recipe names rewards and weights (`grpo.rewards: {format_strict: 1.0, answer_match: 1.0}`);
`tunix_reward_fns` turns them into the batch callables Tunix's GRPOLearner sums.
Nothing here evaluates model text as code: answers are compared as numbers or strings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_STRICT_FORMAT = re.compile(
    r"^\s*<reasoning>(?P<reasoning>.+?)</reasoning>\s*<answer>(?P<answer>.+?)</answer>\s*"
    r"(?:<end_of_turn>\s*)?$",
    re.DOTALL,
)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")


@dataclass(frozen=True)
class Reward:
    name: str
    fn: Callable[[str, str], float]  # (completion, reference answer) -> score
    doc: str


def format_strict(completion: str, answer: str) -> float:
    """1.0 when the completion is exactly <reasoning>...</reasoning><answer>...</answer>."""
    return 1.0 if _STRICT_FORMAT.match(completion) else 0.0


def extract_answer(completion: str) -> str | None:
    """The text of the first <answer>...</answer>, stripped; None if there is none."""
    match = _ANSWER.search(completion)
    return match.group(1).strip() if match else None


def answers_equal(predicted: str, reference: str) -> bool:
    """Numeric comparison when both parse as numbers (1e-6 relative), else exact text."""
    p, r = predicted.strip().replace(",", ""), reference.strip().replace(",", "")
    if _NUMBER.match(p) and _NUMBER.match(r):
        a, b = float(p), float(r)
        return abs(a - b) <= 1e-6 * max(1.0, abs(b))
    return p == r


def answer_match(completion: str, answer: str) -> float:
    """1.0 when the <answer> content equals the reference answer."""
    predicted = extract_answer(completion)
    return 1.0 if predicted is not None and answers_equal(predicted, answer) else 0.0


REGISTRY: dict[str, Reward] = {
    r.name: r
    for r in (
        Reward("format_strict", format_strict, format_strict.__doc__ or ""),
        Reward("answer_match", answer_match, answer_match.__doc__ or ""),
    )
}


def get_reward(name: str) -> Reward:
    if name not in REGISTRY:
        raise ValueError(f"unknown reward {name!r}; registered rewards: {sorted(REGISTRY)}")
    return REGISTRY[name]


def validate_names(weights: dict[str, float]) -> None:
    for name in weights:
        get_reward(name)


def tunix_reward_fns(weights: dict[str, float]) -> list[Callable[..., list[float]]]:
    """Batch callables in Tunix's shape: fn(prompts, completions, answer, **kw) -> scores."""
    validate_names(weights)
    fns = []
    for name, weight in weights.items():
        reward = get_reward(name)

        def batch_fn(
            prompts: Sequence[str],
            completions: Sequence[str],
            answer: Sequence[Any],
            _reward: Reward = reward,
            _weight: float = weight,
            **_: Any,
        ) -> list[float]:
            return [
                _weight * _reward.fn(c, str(a)) for c, a in zip(completions, answer, strict=True)
            ]

        batch_fn.__name__ = name
        fns.append(batch_fn)
    return fns
