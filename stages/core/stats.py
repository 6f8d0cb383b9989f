"""Statistics that tell an evaluation gain from noise: pure functions, no I/O.

A rate measured on a few dozen prompts moves by several points between two equally good
models, so every rate in a report carries a Wilson 95% interval, and two models evaluated on
the same prompts are compared pairwise with the exact McNemar test (only the prompts on which
they disagree carry information about which is better). Two models sampled k times a prompt
are compared on their per-prompt solve rates with a paired sign-flip permutation test: the
first sample alone would throw away k - 1 of every k completions. A choice among k
candidates, each tested against the same incumbent, corrects its p-values for the k tests
(Holm's step-down adjustment): one of k equally good candidates otherwise passes p <= 0.05
up to k times in 20.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: float, trials: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when there are no trials."""
    if trials <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must lie in [0, {trials}], got {successes}")
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def rate_interval(outcomes: Sequence[float]) -> tuple[float, float]:
    """Wilson interval of the mean of 0/1 outcomes (fractions count as partial successes)."""
    return wilson_interval(float(sum(outcomes)), len(outcomes))


def mcnemar_exact_p(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts.

    `only_first`: items the first model got right and the second wrong; `only_second` the
    reverse. Under the null both are equally likely, so the smaller count is binomial(n, 1/2).
    """
    if only_first < 0 or only_second < 0:
        raise ValueError(f"discordant counts must be >= 0, got {only_first}, {only_second}")
    n = only_first + only_second
    if n == 0:
        return 1.0
    k = min(only_first, only_second)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedComparison:
    """Model B against model A on the same prompts (0/1 outcome per prompt)."""

    baseline: str
    candidate: str
    n: int
    baseline_rate: float
    candidate_rate: float
    candidate_only: int  # prompts only the candidate got right
    baseline_only: int  # prompts only the baseline got right
    p_value: float  # exact McNemar, two-sided

    @property
    def difference(self) -> float:
        return self.candidate_rate - self.baseline_rate

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "n": self.n,
            "baseline_rate": self.baseline_rate,
            "candidate_rate": self.candidate_rate,
            "difference": self.difference,
            "candidate_only": self.candidate_only,
            "baseline_only": self.baseline_only,
            "p_value": self.p_value,
        }


def paired_comparison(
    baseline: str,
    baseline_outcomes: Sequence[float],
    candidate: str,
    candidate_outcomes: Sequence[float],
) -> PairedComparison:
    """Exact McNemar comparison of two models' 0/1 outcomes on the same prompts, in order."""
    if len(baseline_outcomes) != len(candidate_outcomes):
        raise ValueError(
            f"paired outcomes need the same prompts: {baseline} has {len(baseline_outcomes)}, "
            f"{candidate} has {len(candidate_outcomes)}"
        )
    pairs = [(bool(a), bool(b)) for a, b in zip(baseline_outcomes, candidate_outcomes, strict=True)]
    candidate_only = sum(1 for a, b in pairs if b and not a)
    baseline_only = sum(1 for a, b in pairs if a and not b)
    n = len(pairs)
    return PairedComparison(
        baseline=baseline,
        candidate=candidate,
        n=n,
        baseline_rate=sum(a for a, _ in pairs) / n if n else 0.0,
        candidate_rate=sum(b for _, b in pairs) / n if n else 0.0,
        candidate_only=candidate_only,
        baseline_only=baseline_only,
        p_value=mcnemar_exact_p(candidate_only, baseline_only),
    )


def pass_at_k(samples: int, correct: int, k: int) -> float:
    """Unbiased pass@k of one prompt from `samples` draws with `correct` right (Chen et al.
    2021): 1 - C(n - c, k) / C(n, k), the chance that k draws without replacement from the n
    hold at least one right completion."""
    if not 1 <= k <= samples:
        raise ValueError(f"pass@k needs 1 <= k <= samples ({samples}), got k={k}")
    if not 0 <= correct <= samples:
        raise ValueError(f"correct must lie in [0, {samples}], got {correct}")
    if samples - correct < k:
        return 1.0
    return 1.0 - math.comb(samples - correct, k) / math.comb(samples, k)


def pass_at_ks(samples: int) -> list[int]:
    """The k reported for n samples a prompt: 1, 2, 4, ... up to n (and n itself)."""
    ks = [1 << i for i in range(samples.bit_length()) if 1 << i <= samples]
    return ks if ks[-1] == samples else [*ks, samples]


def informative_group_chance(solve_rate: float, group: int) -> float:
    """Chance that a GRPO group of `group` completions of a prompt solved at `solve_rate`
    holds both a right and a wrong one (a group with zero reward variance carries no
    gradient): 1 - p^G - (1 - p)^G."""
    return 1.0 - solve_rate**group - (1.0 - solve_rate) ** group


SIGN_FLIPS = 100_000  # draws of the sign-flip test: its p-value is within ~0.002 of the exact one
SIGN_FLIP_SEED = 0  # fixed: a report computed twice from the same samples says the same p


@dataclass(frozen=True)
class PairedRates:
    """Model B against model A on the same prompts, each prompt's solve rate over k samples."""

    n: int
    baseline_rate: float
    candidate_rate: float
    ci_low: float  # 95% interval of the mean per-prompt difference (normal approximation)
    ci_high: float
    prompts_up: int  # prompts the candidate solved more often than the baseline
    prompts_down: int  # and less often
    p_value: float  # two-sided paired sign-flip permutation test of the mean difference

    @property
    def difference(self) -> float:
        return self.candidate_rate - self.baseline_rate


def sign_flip_p(
    differences: np.ndarray, draws: int = SIGN_FLIPS, seed: int = SIGN_FLIP_SEED
) -> float:
    """Two-sided p-value of a mean paired difference: under the null each prompt's difference
    is as likely negative as positive, so flipping signs at random draws the null distribution
    of the sum. (1 + hits) / (1 + draws): never 0, and exact in expectation."""
    d = np.asarray(differences, dtype=np.float64)
    d = d[d != 0]
    if d.size == 0:
        return 1.0
    observed = abs(d.sum()) - 1e-9 * float(np.abs(d).sum())  # ties count as hits
    rng = np.random.default_rng(seed)
    hits, done = 0, 0
    while done < draws:
        chunk = min(10_000, draws - done)
        signs = rng.integers(0, 2, size=(chunk, d.size), dtype=np.int8) * 2 - 1
        hits += int(np.count_nonzero(np.abs(signs @ d) >= observed))
        done += chunk
    return (1 + hits) / (1 + draws)


def holm_adjusted(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values of a family of tests: sorted ascending, the i-th
    smallest (from 0) is multiplied by (k - i), capped at 1 and never below the one before it.
    Rejecting where the adjusted p <= alpha keeps the chance of any false rejection <= alpha
    (Holm 1979) for any dependence between the tests, with more power than Bonferroni."""
    k = len(p_values)
    adjusted: dict[str, float] = {}
    running = 0.0
    for i, (name, p) in enumerate(sorted(p_values.items(), key=lambda item: item[1])):
        running = max(running, min(1.0, (k - i) * p))
        adjusted[name] = running
    return adjusted


def paired_rates(baseline: np.ndarray, candidate: np.ndarray) -> PairedRates:
    """Compare per-prompt solve rates (prompts x samples 0/1 arrays, same prompts in order;
    the two may hold different numbers of samples)."""
    if baseline.shape[0] != candidate.shape[0]:
        raise ValueError(
            f"paired rates need the same prompts: the baseline has {baseline.shape[0]}, "
            f"the candidate {candidate.shape[0]}"
        )
    a, b = baseline.mean(axis=1), candidate.mean(axis=1)
    d = b - a
    n = int(d.size)
    half = Z_95 * float(d.std(ddof=1)) / math.sqrt(n) if n > 1 else float("inf")
    return PairedRates(
        n=n,
        baseline_rate=float(a.mean()) if n else 0.0,
        candidate_rate=float(b.mean()) if n else 0.0,
        ci_low=float(d.mean()) - half if n else 0.0,
        ci_high=float(d.mean()) + half if n else 0.0,
        prompts_up=int(np.count_nonzero(d > 0)),
        prompts_down=int(np.count_nonzero(d < 0)),
        p_value=sign_flip_p(d),
    )
