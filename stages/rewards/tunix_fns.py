"""Rewards handed to Tunix's GRPO: one batch callable per recipe reward in Tunix's shape
`fn(prompts, completions, answer, tests, columns, **kw)`, each returning its weighted scores
(NaN where the reward does not apply, which Tunix's nansum leaves out), and a weighted score
that is not finite stopped as the reward's own failure, not averaged into training."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from schemas.recipe import AnswerFormat
from stages.rewards.guard import RewardFailed, completion_text
from stages.rewards.references import references
from stages.rewards.registry import Reward, Scores, get_reward, validate_names
from stages.rewards.sandboxing import SandboxStats

TUNIX_REWARD = "far_reward"  # set on the callables below: a recipe reward's term, not the baseline


def tunix_reward_fns(
    weights: dict[str, float],
    stats: SandboxStats | None = None,
    answer_format: AnswerFormat = "tags",
) -> list[Callable[..., list[float]]]:
    """Batch callables in Tunix's shape: fn(prompts, completions, answer, tests, columns,
    **kw), grading in `answer_format` (the dataset's). Each returns its weighted scores, NaN
    where the reward does not apply (None), which Tunix's sum leaves out (nansum); a weighted
    score that is not finite (an overflow) is a RewardFailed naming the reward."""
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
            columns: Sequence[Any] | None = None,
            _reward: Reward = reward,
            _weight: float = weight,
            **_: Any,
        ) -> list[float]:
            refs = references(answer, tests, answer_format, prompts, columns)
            scores = _reward.score(completions, refs, counted)
            return weighted(_reward, _weight, scores, completions)

        batch_fn.__name__ = name
        setattr(batch_fn, TUNIX_REWARD, True)
        fns.append(batch_fn)
    return fns


def weighted(
    reward: Reward, weight: float, scores: Scores, completions: Sequence[str]
) -> list[float]:
    """`weight` x each score (NaN where None); RewardFailed when a product is not finite."""
    out = []
    for i, score in enumerate(scores):
        value = math.nan if score is None else weight * score
        if score is not None and not math.isfinite(value):
            raise RewardFailed(
                f"reward {reward.name!r} ({reward.module}) scored {score!r} for completion {i} "
                f"{completion_text(completions[i])}, {value!r} at weight {weight:g}; "
                f"expected a finite weighted score: keep the reward's values in a sane range"
            )
        out.append(value)
    return out
