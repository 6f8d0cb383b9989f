"""bench/reinforce_mode.py's sampled rows: each arm's pass@1 from the `sampled` node's
samples, paired with the control's and the starting SFT's per-prompt solve rates by prompt
id (not by the order the rows were written in)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import reinforce_mode as bench

SOLVED = {  # model -> prompt id -> its two samples' verdicts
    "sft": {"a": [1, 0], "b": [0, 0], "c": [1, 1], "d": [0, 1]},
    "control": {"a": [1, 1], "b": [0, 0], "c": [1, 1], "d": [0, 1]},
    "grpo": {"d": [1, 1], "c": [1, 0], "b": [1, 0], "a": [1, 1]},  # written in another order
}


def test_sampled_arms_pair_each_prompt_by_id(tmp_path: Path) -> None:
    rows = [
        {"model": model, "id": prompt, "sample": i, "correct": verdict}
        for model, by_id in SOLVED.items()
        for prompt, verdicts in by_id.items()
        for i, verdict in enumerate(verdicts)
    ]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    arms = {row["model"]: row for row in bench.sampled_arms(str(tmp_path))}
    assert [arms[m]["pass_at_1"] for m in SOLVED] == [0.5, 0.625, 0.75]
    grpo = arms["grpo"]
    assert (grpo["prompts"], grpo["samples"]) == (4, 2)
    # per prompt a, b, c, d: grpo 1, .5, .5, 1 against the control's 1, 0, 1, .5
    assert grpo["vs_control"]["difference"] == pytest.approx(0.125)
    assert (grpo["vs_control"]["prompts_up"], grpo["vs_control"]["prompts_down"]) == (2, 1)
    assert (grpo["vs_sft"]["prompts_up"], grpo["vs_sft"]["prompts_down"]) == (3, 1)
    assert arms["control"]["vs_control"]["p_value"] == 1.0
    assert 0 < grpo["vs_sft"]["p_value"] <= 1


def test_the_pick_is_replayed_from_choice_json_with_and_without_holm() -> None:
    """A choice.json row holds wins and losses, not a p-value (runs before max_p): the bench
    recomputes McNemar's p from them. 14 won / 3 lost (p 0.013) passes max_p 0.05 alone;
    over 6 choices Holm makes it 0.077 and keeps the incumbent."""
    rows = [{"name": "sft", "accuracy": 0.80, "wins_vs_incumbent": 0, "losses_vs_incumbent": 0}]
    rows.append(
        {"name": "grpo", "accuracy": 0.84, "wins_vs_incumbent": 14, "losses_vs_incumbent": 3}
    )
    rows += [
        {"name": f"arm{i}", "accuracy": 0.79, "wins_vs_incumbent": 5, "losses_vs_incumbent": 8}
        for i in range(5)
    ]
    choice = {"candidates": rows, "min_gain": 0.0}
    assert bench.chosen_under_max_p(choice, 0.05) == "grpo"
    assert bench.chosen_under_max_p(choice, 0.05, "holm") == "sft"
    assert bench.holm_p(choice)["grpo"] == pytest.approx(6 * 0.01273, abs=1e-3)


def test_the_readme_sampled_table_puts_each_seed_beside_the_others_by_model() -> None:
    def run(seed: int, models: list[str]) -> dict[str, Any]:
        zero = {"difference": 0.0, "ci95": [0.0, 0.0], "p_value": 1.0}
        rows = [
            {"model": m, "pass_at_1": 0.5 + seed / 10, "ci95": [0.4, 0.6], "vs_control": zero}
            | {"vs_sft": zero}
            for m in models
        ]
        return {"run": f"d{seed}", "data_seed": seed, "sampled": rows}

    text = bench.readme_sampled_table([run(1, ["sft", "grpo"]), run(0, ["sft", "grpo"])])
    lines = text.splitlines()
    assert lines[0].startswith("| model | seed 1: pass@1 [95% CI] |")
    assert "seed 0: pass@1" in lines[0] and len(lines) == 4
    assert lines[3].startswith("| grpo | 0.600 [0.40, 0.60] | +0.000 [+0.000, +0.000] (1) |")
    assert "| 0.500 [0.40, 0.60] |" in lines[3]
    with pytest.raises(ValueError, match="another order"):
        bench.readme_sampled_table([run(1, ["sft", "grpo"]), run(0, ["grpo", "sft"])])
