"""ReMax's greedy baseline (arXiv 2310.10505): each sample is judged against the reward of the
current policy's greedy completion of its prompt, not against its group's mean.

With the group baseline, a prompt whose greedy answer is wrong and whose samples mostly agree
with it pays the rare right sample and punishes the rest, but a prompt whose samples are all
right pays nothing and one whose samples are mostly right pays each for agreeing with the
mode: GRPO sharpens. Against the greedy completion, a right sample earns +1 only where greedy
is wrong, and where greedy is right a right sample earns 0 and a wrong one -1.

`GreedyBaseline` is a Tunix reward function, the last of the learner's: it decodes the step's
distinct prompts greedily through the cluster's public `generate(mode=EVAL)` (the cluster's
EVAL rollout config is greedy: top_p and top_k None), scores each greedy completion with the
same weighted rewards, and returns -R(greedy) on every row of that prompt. Tunix sums the
reward terms, so the total it hands the advantage estimator is R(sample) - R(greedy), and
stages/grpo/advantages.greedy_baseline_advantages passes it through.

Why inside the reward call: it runs in the learner's `_generate_and_compute_advantage` right
after that step's rollout and before the actor update, in the same thread, so the greedy
decode uses the very weights that sampled the step's completions (FAR's rollout engine
samples with the actor's own model; Tunix's separate rollout model is synced before the
step's rollout). Tunix repeats each prompt `num_generations` times in a row
(rl_learner: np.repeat over the batch), which `__call__` checks rather than assumes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NAME = "minus_greedy"
"""The baseline's reward name: Tunix logs its per-row values (-R(greedy)) as rewards/<NAME>."""


@dataclass(frozen=True)
class GreedyStep:
    """The last call's greedy decode: one entry per distinct prompt, in the batch's order."""

    prompts: list[str]
    completions: list[str]
    rewards: np.ndarray  # the weighted sum of every reward term, per prompt


class GreedyBaseline:
    """Tunix reward fn returning -R(greedy completion of the row's prompt) on each row.

    `reward_fns`: the learner's other reward functions (Tunix's batch shape); `decode`: the
    distinct prompts -> their greedy completions by the current policy.
    """

    def __init__(
        self,
        reward_fns: Sequence[Callable[..., Sequence[float]]],
        num_generations: int,
        decode: Callable[[list[str]], list[str]],
    ) -> None:
        self.__name__ = NAME  # Tunix names a reward's metric after its function
        self.reward_fns = list(reward_fns)
        self.num_generations = num_generations
        self.decode = decode
        self.last: GreedyStep | None = None

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], **kwargs: Any
    ) -> list[float]:
        distinct = group_prompts(prompts, self.num_generations)
        greedy = list(self.decode(distinct))
        if len(greedy) != len(distinct):
            raise RuntimeError(
                f"the greedy decode returned {len(greedy)} completions for {len(distinct)} prompts"
            )
        per_prompt = {
            k: per_group(v, len(prompts), self.num_generations) for k, v in kwargs.items()
        }
        terms = [
            np.asarray(fn(prompts=distinct, completions=greedy, **per_prompt), dtype=np.float64)
            for fn in self.reward_fns
        ]
        scores = np.nansum(np.stack(terms), axis=0)  # Tunix sums the terms the same way
        self.last = GreedyStep(distinct, greedy, scores)
        return [float(-s) for s in np.repeat(scores, self.num_generations)]

    def rows(self) -> np.ndarray:
        """The last call's greedy reward on each row (prompt repeated num_generations times)."""
        if self.last is None:
            raise RuntimeError("GreedyBaseline.rows() before the baseline was computed")
        return np.repeat(self.last.rewards, self.num_generations)


def group_prompts(prompts: Sequence[str], num_generations: int) -> list[str]:
    """The distinct prompts of a batch in which each prompt fills `num_generations` rows in a
    row (Tunix's order); anything else is an error, not a silent mismatch of baselines."""
    if len(prompts) % num_generations:
        raise ValueError(
            f"{len(prompts)} rows do not split into groups of num_generations={num_generations}"
        )
    distinct = [str(p) for p in prompts[::num_generations]]
    for index, prompt in enumerate(distinct):
        group = prompts[index * num_generations : (index + 1) * num_generations]
        if any(str(p) != prompt for p in group):
            raise ValueError(
                f"rows {index * num_generations}..{(index + 1) * num_generations - 1} do not "
                f"all hold one prompt; the greedy baseline expects each prompt repeated "
                f"num_generations={num_generations} times in a row, as Tunix 0.1.7 does"
            )
    return distinct


def per_group(value: Any, rows: int, num_generations: int) -> Any:
    """A per-row reward argument (answer, tests) cut to one entry per group; others as is."""
    if isinstance(value, (list, tuple, np.ndarray)) and len(value) == rows:
        return value[::num_generations]
    return value
