"""Pure parts of the GRPO stage: per-step rollout seeds, group-variance metric, samples file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from stages.grpo import metrics, rollouts
from stages.grpo import training as grpo


def test_step_seeds_differ_per_step_and_call_and_repeat_exactly() -> None:
    seeds = {rollouts.step_seed(0, step, call) for step in range(50) for call in range(2)}
    assert len(seeds) == 100
    assert rollouts.step_seed(7, 3, 0) == rollouts.step_seed(7, 3, 0)
    assert rollouts.step_seed(7, 3, 0) != rollouts.step_seed(8, 3, 0)
    assert all(0 <= s < 2**31 for s in seeds)


def test_zero_variance_fraction_counts_groups_with_equal_rewards() -> None:
    scores = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    assert metrics.zero_variance_fraction(scores, 4) == 2 / 3


def test_observer_keeps_samples_and_reports_format_rate() -> None:
    observer = metrics.StepObserver(2, 1, lambda: 5, lambda step: 99)
    good = "<reasoning>a</reasoning><answer>1</answer>"
    out = observer(["p", "p"], [good, "junk"], np.array([1.0, 0.0]), np.zeros(2))
    assert out[metrics.FORMAT_RATE][0] == 0.5
    assert out[metrics.ZERO_VARIANCE][0] == 0.0
    assert observer.samples == [
        {"step": 5, "rollout_seed": 99, "prompt": "p", "completion": good, "reward": 1.0}
    ]


def test_save_samples_drops_rows_a_resumed_session_redoes(tmp_path: Path) -> None:
    uri = str(tmp_path / "samples.jsonl")
    grpo.save_samples(uri, [{"step": s} for s in range(5)], 0)
    grpo.save_samples(uri, [{"step": 3}, {"step": 4}, {"step": 5}], 3)  # resumed at step 3
    steps = [json.loads(x)["step"] for x in Path(uri).read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4, 5]
