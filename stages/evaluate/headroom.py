"""Headroom: how much a sampled policy could gain if RL turned its pass@k into pass@1.

RL on a verifiable reward mostly sharpens what a policy can already sample (Yue et al. 2025):
a prompt the policy never solves in k samples gives GRPO no right completion to reinforce, and
one it always solves gives a group whose rewards are all equal, so no gradient either. With k
samples per prompt this module measures pass@1 (the mean over samples), the unbiased pass@k for
k = 1, 2, 4, ... n, and the solve-rate histogram: how many prompts were solved 0, 1, ... n
times of n. The prompts solved sometimes are the ones GRPO can learn from (hard_subset's
informative band keeps exactly those); pass@n - greedy is the gain on offer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stages.core import stats

NEVER, SOMETIMES, ALWAYS = "solved_never", "solved_sometimes", "solved_always"


def histogram_key(solved: int, samples: int) -> str:
    """The metric name of the number of prompts solved `solved` times of `samples`."""
    return f"solved_{solved}_of_{samples}"


def headroom_metrics(per_prompt: np.ndarray) -> dict[str, float]:
    """pass@k (unbiased) for k = 1, 2, 4, ... n, the solve-rate histogram (prompt counts) and
    the shares of prompts never, sometimes and always solved, from a prompts x n 0/1 array."""
    prompts, samples = per_prompt.shape
    if samples < 2:
        raise ValueError(f"headroom needs at least 2 samples a prompt, got {samples}")
    solved = per_prompt.sum(axis=1).round().astype(int)
    metrics = {
        f"pass@{k}": float(np.mean([stats.pass_at_k(samples, int(c), k) for c in solved]))
        for k in stats.pass_at_ks(samples)
    }
    counts = np.bincount(solved, minlength=samples + 1)
    metrics |= {histogram_key(c, samples): float(counts[c]) for c in range(samples + 1)}
    metrics |= {
        NEVER: float(counts[0]) / prompts,
        SOMETIMES: float(counts[1:samples].sum()) / prompts,
        ALWAYS: float(counts[samples]) / prompts,
    }
    return metrics


def headroom_table(rows: Sequence[tuple[str, int, dict[str, float], float | None]]) -> str:
    """Markdown: one line per sampled model (label, samples n, metrics, greedy accuracy or
    None), then its solve-rate histogram."""
    if not rows:
        return ""
    samples = max(n for _, n, _, _ in rows)
    ks = stats.pass_at_ks(samples)
    lines = [
        "| model | samples | greedy | " + " | ".join(f"pass@{k}" for k in ks) + " | majority"
        " | never solved | sometimes | always |",
        "|---|---:|---:|" + "---:|" * (len(ks) + 4),
    ]
    for label, n, m, greedy in rows:
        cells = [f"{m[f'pass@{k}']:.3f}" if f"pass@{k}" in m else "-" for k in ks]
        lines.append(
            f"| {label} | {n} | {'-' if greedy is None else f'{greedy:.3f}'} | "
            + " | ".join(cells)
            + f" | {m.get('majority_accuracy', float('nan')):.3f} | {m[NEVER]:.3f} | "
            f"{m[SOMETIMES]:.3f} | {m[ALWAYS]:.3f} |"
        )
    lines += ["", "Prompts by times solved (of n samples):", ""]
    lines += [
        "| model | " + " | ".join(str(c) for c in range(samples + 1)) + " |",
        "|---|" + "---:|" * (samples + 1),
    ]
    for label, n, m, _ in rows:
        cells = [f"{m[histogram_key(c, n)]:.0f}" if c <= n else "-" for c in range(samples + 1)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    note = (
        "\npass@k is the unbiased estimator from n samples; pass@1 is the mean over samples. "
        "Prompts solved sometimes are those a GRPO group can learn from; pass@n above greedy "
        "is the gain RL could turn into greedy accuracy.\n"
    )
    return "\n".join(lines) + "\n" + note
