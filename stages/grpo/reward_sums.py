"""GRPO's summed reward, checked: Tunix's sequence-level reward manager, registered under a
name of FAR's own through Tunix's public reward-manager registry.

Tunix sums the reward terms (nansum) and logs each term's mean. FAR's reward callables
(stages/rewards `tunix_reward_fns`) return NaN where a user's batch reward said None (not
applicable), so:

- each reward's logged mean (rewards/<name>) is over the completions it applies to (a step
  where it applies to none logs nothing for it);
- a prompt none of whose completions got any applicable reward has all its rows' sums set to
  0 (baseline term included): a flat group, so advantage 0 under every estimator, and the
  step logs the share of such prompts as far/groups_without_reward;
- a sum, or an advantage, that is not finite (a reward of 1e308, weighted or summed into an
  overflow) stops the stage with RewardFailed naming the reward with the largest term,
  before any update trains on it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tunix.rl import function_registry
from tunix.rl.reward_manager import SequenceRewardManager

from stages.rewards import TUNIX_REWARD, RewardFailed, completion_text

NAME = "far_checked_sum"
"""The manager's name in Tunix's registry (the algorithm config's reward_manager)."""
WITHOUT_REWARD = "far/groups_without_reward"
"""Share of a step's prompts none of whose completions any reward applied to (no gradient)."""


@function_registry.register_reward_manager(NAME)
class CheckedSum(SequenceRewardManager):
    """Tunix's sum, with not-applicable terms left out of the means and overflows stopped."""

    def _compute_rewards(self, prompts: Any, completions: Any, **kwargs: Any) -> dict[str, Any]:
        info = super()._compute_rewards(prompts, completions, **kwargs)
        names = [fn.__name__ for fn in self.reward_fns]
        terms = np.stack([info["log_metrics"][f"rewards/{n}"][0] for n in names], axis=1)
        own = [bool(getattr(fn, TUNIX_REWARD, False)) for fn in self.reward_fns]
        sums = np.asarray(info["rewards"], dtype=np.float64).copy()
        generations = self.algo_config.num_generations
        applies = ~np.isnan(terms[:, own]).all(axis=1).reshape(-1, generations).any(axis=1)
        sums[np.repeat(~applies, generations)] = 0.0
        check_finite(sums, terms, names, completions, "sum to")
        estimator = function_registry.get_advantage_estimator(self.algo_config.advantage_estimator)
        advantages = np.asarray(estimator(rewards=sums, num_generations=generations))
        check_finite(advantages, terms, names, completions, "have the advantage")
        info["rewards"] = sums
        info["log_metrics"] = means_applicable(info["log_metrics"], terms, names)
        info["log_metrics"][WITHOUT_REWARD] = (float(np.mean(~applies)), np.mean)
        return dict(info)


def means_applicable(
    log_metrics: dict[str, Any], terms: np.ndarray, names: list[str]
) -> dict[str, Any]:
    """Tunix's log metrics with each term's mean over the rows it applies to, and the row
    aggregates (sum, mean, min, max) over the applicable terms (a row with none: 0)."""
    out = dict(log_metrics)
    for column, name in enumerate(names):
        values = terms[:, column]
        out.pop(f"rewards/{name}")
        if not np.isnan(values).all():
            out[f"rewards/{name}"] = (values[~np.isnan(values)], np.mean)
    filled = np.where(np.isnan(terms), 0.0, terms)
    rows = {"sum": filled.sum(axis=1), "mean": filled.mean(axis=1)}
    rows |= {"min": filled.min(axis=1), "max": filled.max(axis=1)}
    aggregate = {"sum": np.mean, "mean": np.mean, "min": np.min, "max": np.max}
    for key, values in rows.items():
        out[f"rewards/{key}"] = (values, aggregate[key])
    return out


def check_finite(
    values: np.ndarray, terms: np.ndarray, names: list[str], completions: Any, what: str
) -> None:
    """RewardFailed naming the first non-finite row's completion and its largest term."""
    bad = np.flatnonzero(~np.isfinite(values))
    if not bad.size:
        return
    row = int(bad[0])
    magnitudes = np.where(np.isnan(terms[row]), -1.0, np.abs(terms[row]))
    largest = int(np.argmax(magnitudes))
    raise RewardFailed(
        f"the weighted rewards of completion {row} {completion_text(str(completions[row]))} "
        f"{what} {float(values[row])!r}, so the policy would train on it; reward "
        f"{names[largest]!r} gave {float(terms[row, largest])!r}: keep its "
        f"values (times its weight) far from the float range, e.g. within [-1e6, 1e6]"
    )
