"""What a GRPO run shows per step: reward curves, KL, lengths, format rate, sample completions.

Tunix logs each reward's mean, the total, completion lengths (and the actor's KL) through its
metrics logger, to TensorBoard when the training config names a log directory.
`StepObserver` is a Tunix metric_fn that adds what Tunix does not compute, the fraction of
groups whose rewards are all equal (they carry no GRPO signal; its complement is logged as the
informative-group fraction) and the strict-format rate,
and keeps a few completions per step. With `baseline: greedy` (stages/grpo/baseline.py) the
total Tunix logs as rewards/score/mean is R(sample) - R(greedy), so the observer also logs
the greedy completions' mean reward, the samples' own mean reward and the fraction of rows
whose advantage is not 0 (the rows that move the policy), and each kept sample row carries
its prompt's greedy completion and reward. `MetricsHistory` collects the per-step numbers
through the cluster's external-logger hook for the stage record, and `summary` sums up the
record's whole history (every session's steps).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from schemas.recipe import AnswerFormat
from stages import rewards
from stages.grpo.baseline import GreedyBaseline
from stages.modeling.training_tail import ends

ZERO_VARIANCE = "far/zero_variance_groups"
INFORMATIVE = "far/informative_groups"  # 1 - ZERO_VARIANCE: the groups that carry a gradient
UPDATE_INFORMATIVE = "far/update_informative_groups"  # oversample: of the groups kept
FORMAT_RATE = "far/format_rate"
TOTAL_REWARD = "rewards/score/mean"  # Tunix: the per-step mean of the summed rewards
LENGTHS = ("completions/mean_length", "completions/max_length")
GREEDY_REWARD = "rewards/greedy/mean"  # baseline: greedy: R(greedy completion), per prompt
SAMPLE_REWARD = "rewards/sample/mean"  # baseline: greedy: R(sample), what score is without it
NONZERO_ADVANTAGE = "far/nonzero_advantage"  # baseline: greedy: rows with advantage != 0
SECONDS_PREFIX = "far/seconds/"  # per-phase step timing (stages/grpo/timing.py)


def zero_variance_fraction(scores: np.ndarray, num_generations: int) -> float:
    """Fraction of prompt groups whose completions all got the same total reward."""
    groups = np.asarray(scores, dtype=np.float64).reshape(-1, num_generations)
    return float(np.mean(np.ptp(groups, axis=1) == 0.0))


class StepObserver:
    """Tunix metric_fn: group-variance and format metrics, plus sample completions per step."""

    def __init__(
        self,
        num_generations: int,
        samples_per_step: int,
        step_of: Callable[[], int],
        seed_of: Callable[[int], int | None],
        answer_format: AnswerFormat = "tags",
        baseline: GreedyBaseline | None = None,
    ) -> None:
        self.answer_format = answer_format  # the dataset's: the format rate is judged in it
        self.baseline = baseline  # baseline: greedy's reward term, read after it has run
        self.num_generations = num_generations
        self.samples_per_step = samples_per_step
        self.step_of, self.seed_of = step_of, seed_of
        self.samples: list[dict[str, Any]] = []

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rewards: Any,
        advantages: Any,
        **_: Any,
    ) -> dict[str, tuple[float, Callable[..., Any]]]:
        step, scores = self.step_of(), np.asarray(rewards, dtype=np.float64)
        greedy = None if self.baseline is None else self.baseline.rows()
        sampled = scores if greedy is None else scores + greedy  # the samples' own rewards
        for i in range(min(self.samples_per_step, len(completions))):
            row = {
                "step": step,
                "rollout_seed": self.seed_of(step),
                "prompt": str(prompts[i]),
                "completion": str(completions[i]),
                "reward": float(sampled[i]),
            }
            if self.baseline is not None and self.baseline.last is not None:
                row["greedy_completion"] = self.baseline.last.completions[i // self.num_generations]
                row["greedy_reward"] = float(self.baseline.last.rewards[i // self.num_generations])
            self.samples.append(row)
        strict = [rewards_format(c, self.answer_format) for c in completions]
        flat = zero_variance_fraction(scores, self.num_generations)
        out = {
            ZERO_VARIANCE: (flat, np.mean),
            INFORMATIVE: (1.0 - flat, np.mean),
            FORMAT_RATE: (float(np.mean(strict)), np.mean),
        }
        if greedy is not None:
            out[GREEDY_REWARD] = (float(np.mean(greedy)), np.mean)
            out[SAMPLE_REWARD] = (float(np.mean(sampled)), np.mean)
            moving = np.asarray(advantages, dtype=np.float64) != 0
            out[NONZERO_ADVANTAGE] = (float(np.mean(moving)), np.mean)
        return out


def rewards_format(completion: str, answer_format: AnswerFormat = "tags") -> float:
    return rewards.format_strict(completion, rewards.Reference("", answer_format=answer_format))


class MetricsHistory:
    """Collects Tunix's per-step numeric RL metrics through its public external-logger hook."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}
        self.steps: list[int] = []

    def __call__(self, buffer: Any) -> None:
        if buffer.mode != "train":
            return
        self.steps.append(int(buffer.global_steps))
        for name, (value, op) in buffer.metrics.items():
            array = np.asarray(value)
            if array.dtype.kind not in "biuf" or array.size == 0:
                continue  # text samples (prompts, completions) are not metrics
            scalar = op(array) if op is not None else array.mean()
            self.values.setdefault(name, []).append(float(scalar))

    def latest_reward(self) -> dict[str, float]:
        """The last step's mean total reward, for progress lines (empty before the first)."""
        # baseline: greedy: the samples' reward, not their margin over the greedy completion
        totals = self.values.get(SAMPLE_REWARD, self.values.get(TOTAL_REWARD))
        return {"reward": totals[-1]} if totals else {}

    def curves(self, kl: Sequence[float]) -> dict[str, list[float]]:
        """Per-step reward means, total reward, zero-variance groups, format rate, lengths, KL."""
        wanted = [n for n in self.values if n.startswith(("rewards/", "far/")) or n in LENGTHS]
        curves = {name: self.values[name] for name in sorted(wanted)}
        curves["global_step"] = [float(s) for s in self.steps]
        curves["kl"] = [float(x) for x in kl]
        return curves


def summary(curves: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """The record's summary of its history (every session's steps, from history_from_step):
    first and last value of every reward metric and the format rate, the mean
    informative-group fraction (and, baseline: greedy, the mean fraction of rows with a
    non-zero advantage), and the total seconds of each timed phase (far/seconds/<phase>,
    stages/grpo/timing.py)."""
    out: dict[str, float] = {}
    for name, values in sorted(curves.items()):
        if name.startswith("rewards/") or name == FORMAT_RATE:
            out[f"{name}/first"], out[f"{name}/last"] = ends(values)
        elif name in (INFORMATIVE, NONZERO_ADVANTAGE) and values:
            out[f"{name}/mean"] = float(np.mean(values))
        elif name.startswith(SECONDS_PREFIX):
            out[f"{name}/total"] = float(sum(values))
    return out
