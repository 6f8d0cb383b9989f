"""GRPO's advantages with groups that carry no gradient left out of the loss's denominator.

A group whose completions all earn the same reward has zero advantage everywhere, yet Tunix's
GRPO loss (`sequence-mean-token-mean`) still averages over its completions, so the fewer groups
have spread, the smaller every step's gradient: on the headroom recipe only 0.48 of the groups
did. `flat_groups: drop` registers this estimator with Tunix's public advantage-estimator
registry: GRPO's group-normalized advantages, those of the informative groups scaled by
groups / informative groups, which makes the policy-gradient term the mean over informative
completions only (the PPO-clipped objective is linear in the advantage, so the scale carries
through the clipping; a KL term, when beta > 0, stays averaged over every completion).

`baseline: greedy` registers the second estimator, ReMax's (stages/grpo/baseline.py puts the
greedy completion's reward into the rewards it receives).
"""

from __future__ import annotations

import numpy as np
from tunix.rl import algo_core, function_registry
from tunix.rl.common import TrainExample

INFORMATIVE_GROUPS = "far_informative_groups"
"""The estimator's name in Tunix's registry (GRPOConfig.advantage_estimator)."""


@function_registry.register_advantage_estimator(INFORMATIVE_GROUPS)
def informative_group_advantages(rewards: np.ndarray, num_generations: int) -> np.ndarray:
    """GRPO's advantages, rescaled so groups without reward spread do not count."""
    advantages = np.asarray(algo_core.compute_advantages(rewards, num_generations))
    grouped = np.asarray(rewards).reshape(-1, num_generations)
    informative = int(np.sum(grouped.max(axis=-1) > grouped.min(axis=-1)))
    if informative == 0:  # every advantage is 0: nothing to rescale
        return advantages
    return advantages * (grouped.shape[0] / informative)


GREEDY_BASELINE = "far_greedy_baseline"
"""The `baseline: greedy` estimator's name in Tunix's registry."""


@function_registry.register_advantage_estimator(GREEDY_BASELINE)
def greedy_baseline_advantages(rewards: np.ndarray, num_generations: int) -> np.ndarray:
    """ReMax's advantages: the rewards as they come, each already r(sample) - r(greedy).

    The greedy baseline enters as one more reward term, -r(greedy) on each row of the prompt
    (stages/grpo/baseline.py), and Tunix sums the terms, so nothing is left to subtract; no
    group mean is taken (it would bring back the group baseline). Nothing is divided either:
    ReMax does not normalize, and dividing by the group's std would scale a group whose
    samples happen to agree (std 0, yet all wrong against a right greedy answer) to infinity
    and blow up small spreads; the advantages stay in reward units, bounded by the reward
    weights. `num_generations` is Tunix's estimator signature; the rows need no grouping.
    """
    del num_generations
    return np.asarray(rewards, dtype=np.float32)


ROW_FIELDS = (
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "ref_per_token_logps",
    "old_per_token_logps",
    "sampler_is_weights",
)
"""A TrainExample's per-row arrays besides the advantages (Tunix 0.1.7, unpacked)."""


def informative_rows(example: TrainExample, num_generations: int) -> TrainExample:
    """`example` without the groups whose advantages are all exactly 0, for the actor update.

    With no KL term (beta 0), such a group's rows add exactly 0 to the GRPO policy loss and
    its gradient (the clipped objective is linear in the advantage), yet the update runs its
    forward and backward over them: at half the groups without reward spread, half of the
    update is spent on nothing. The kept rows are the informative groups and, to keep the
    number of compiled shapes of the actor's step small, as many flat groups as fill the
    count of groups up to a power of two (at least one group). Tunix's
    `sequence-mean-token-mean` loss divides the rows' sum by the non-empty rows, so the
    kept advantages are scaled by kept / all non-empty rows: the loss and gradients equal
    the full example's to float rounding (tests/unit/test_grpo_padding.py). 2-D (packed,
    per-token) advantages are left alone.
    """
    advantages = np.asarray(example.advantages)
    if advantages.ndim != 1:
        return example
    groups = advantages.reshape(-1, num_generations)
    informative = np.any(groups != 0, axis=1)
    wanted = min(groups.shape[0], 1 << max(0, int(informative.sum()) - 1).bit_length())
    fill = np.flatnonzero(~informative)[: wanted - int(informative.sum())]
    chosen = np.sort(np.concatenate([np.flatnonzero(informative), fill]))
    rows = group_rows(chosen, num_generations)
    nonempty = np.asarray(example.completion_mask).sum(axis=1) > 0
    scale = max(1, int(nonempty[rows].sum())) / max(1, int(nonempty.sum()))
    return take_rows(example, rows, scale)


def group_rows(groups: np.ndarray, num_generations: int) -> np.ndarray:
    """The row indices of `groups` (group g holds rows g*G .. g*G + G - 1), in order."""
    return (np.asarray(groups)[:, None] * num_generations + np.arange(num_generations)).ravel()


def take_rows(example: TrainExample, rows: np.ndarray, scale: float) -> TrainExample:
    """`example`'s `rows`, their advantages multiplied by `scale`."""
    fields = {
        name: getattr(example, name)[rows]
        for name in ROW_FIELDS
        if getattr(example, name, None) is not None
    }
    return example.replace(**fields, advantages=example.advantages[rows] * scale)


def oversampled_groups(
    example: TrainExample, num_generations: int, keep: int, drop_flat: bool
) -> tuple[TrainExample, float]:
    """`keep` of `example`'s groups for the actor update (grpo.oversample), those with any
    non-zero advantage first, in their order, then flat ones; and the share of the kept
    groups that are informative.

    The loss is then GRPO's on the kept groups as if only they had been sampled: a group's
    advantages depend on its own rewards alone, and Tunix's sequence-mean loss divides by the
    rows it gets. Only `flat_groups: drop` (`drop_flat`) needs a rescale: its estimator scaled
    the informative groups by all / informative groups of the whole rollout, and the kept
    groups want kept / informative kept (tests/unit/test_grpo_padding.py).
    """
    advantages = np.asarray(example.advantages)
    groups = advantages.reshape(advantages.shape[0] // num_generations, -1)
    informative = np.flatnonzero(np.any(groups != 0, axis=1))
    flat = np.flatnonzero(~np.any(groups != 0, axis=1))
    chosen = np.sort(np.concatenate([informative[:keep], flat[: max(0, keep - len(informative))]]))
    kept = min(keep, len(informative))
    scale = 1.0
    if drop_flat and kept:  # from all / informative to kept / informative kept
        scale = (len(chosen) / kept) / (groups.shape[0] / len(informative))
    return take_rows(example, group_rows(chosen, num_generations), scale), kept / len(chosen)
