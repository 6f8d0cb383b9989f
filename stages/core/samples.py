"""An evaluation's per-sample rows, read by the stages that act on them.

hard_subset, preferences and pick all read an evaluate stage's samples.jsonl (one row per
completion: model label, prompt id, completion, format, correct, ...). They may not import the
evaluate stage, so the reading and the one grouping they share, a model's greedy answer beside
its samples (`EvalConfig.greedy`), live here.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from schemas.artifacts import GREEDY_SUFFIX, EvalReport
from stages.core import storage
from stages.core.errors import InputError


def read_samples(report: EvalReport) -> list[dict[str, Any]]:
    """Every row of the evaluation's samples.jsonl."""
    text = storage.read_text(report.samples_uri)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class ModeView:
    """One model's greedy completion and its sampled completions, per prompt id."""

    greedy: dict[str, dict[str, Any]]
    sampled: dict[str, list[dict[str, Any]]]

    def solve_rate(self, prompt: str) -> float:
        """The share of the prompt's samples that are correct."""
        rows = self.sampled.get(prompt, [])
        return sum(float(r["correct"]) for r in rows) / len(rows) if rows else 0.0

    def greedy_right(self, prompt: str) -> bool:
        return float(self.greedy[prompt]["correct"]) == 1.0

    def wrong_mode(self) -> list[str]:
        """Prompts whose greedy answer is wrong while a sample solves them, in id order."""
        return sorted(p for p in self.greedy if not self.greedy_right(p) and self.solve_rate(p))


def mode_view(samples: list[dict[str, Any]], model: str, field: str) -> ModeView:
    """`model`'s greedy rows (`<model>@greedy`) and sampled rows (`<model>`) by prompt id;
    an evaluation without both is an InputError naming `field` and the fix."""
    greedy_label = model + GREEDY_SUFFIX
    greedy: dict[str, dict[str, Any]] = {}
    sampled: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in samples:
        if row["model"] == greedy_label:
            greedy[str(row["id"])] = row
        elif row["model"] == model:
            sampled[str(row["id"])].append(row)
    if not greedy or not sampled:
        labels = sorted({str(r["model"]) for r in samples})
        raise InputError(
            f"{field}: needs the evaluation's sampled rows of {model!r} and its greedy rows "
            f"{greedy_label!r}; it has {labels} (evaluate {model} with samples >= 2, a "
            f"temperature and greedy: true)"
        )
    return ModeView(greedy, dict(sampled))
