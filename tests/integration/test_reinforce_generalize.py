"""recipes/reinforce-generalize.yaml's DAG on the tiny model (tests/scaled_recipes.py
`scaled_generalize`), end to end through the flow: every node commits, in particular every
arm's; the control trained on the pool's gold rows; and the results page's tables
(bench/reinforce_generalize.py) build from the run's records, per level and sampled at k+2,
with each GRPO arm's completions per second."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import reinforce_generalize, reinforce_mode
from flows.far_flow import format_align_reinforce
from pipeline.dag import build_dag
from stages.core import storage
from tests.scaled_recipes import SFT_CHECKPOINT_EVERY, SFT_STEPS, scaled_generalize

# the session's Prefect API (an in-process harness the other flow tests share), not a
# temporary server of its own
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]

ARMS = ("control", "self", "orpo", "grpo", "random")
SAMPLED = ["control", "sft", "self", "orpo", "grpo", "random"]  # the k2_sampled node's order


def validation_dir(run: Path) -> str:
    """The validation node's directory in `run`."""
    return str(reinforce_mode.records(run)["validation"]["_dir"])


def test_the_generalize_dag_runs_tiny_and_its_tables_build(tmp_path: Path) -> None:
    recipe = scaled_generalize(str(tmp_path))
    summary = format_align_reinforce(recipe, storage.normalize(str(tmp_path)))
    assert summary.complete, summary.stopped_reason
    assert [s.stage for s in summary.stages] == list(build_dag(recipe).ids)
    records = {s.stage: storage.read_json(s.record_uri) for s in summary.stages}
    assert {n: r["status"] for n, r in records.items()} == dict.fromkeys(records, "complete")
    pool = records["pool"]["metrics"]
    assert pool["gold_rows"] + pool["gold_rows_too_long"] == pool["prompts_kept"] > 0
    validated = reinforce_mode.greedy_outcomes(validation_dir(tmp_path / recipe.name), "correct")
    # every arm offers the pick the same steps: its grid's (every 2 steps), never Orbax's
    # save of a GRPO or DPO arm's first step; SFT's earlier grid steps stay candidates
    earlier = range(SFT_CHECKPOINT_EVERY, SFT_STEPS, SFT_CHECKPOINT_EVERY)
    assert sorted(validated) == sorted(["sft", *ARMS, *(f"sft@step{s}" for s in earlier)])
    result = reinforce_generalize.summary(tmp_path / recipe.name)
    assert result is not None
    page = reinforce_generalize.page([result])
    for level in reinforce_generalize.LEVELS:
        assert set(result["per_prompt"][level]["correct"]) == {
            "sft",
            *ARMS,
            "chosen",
            "control_wall",
        }
        assert [r["model"] for r in result["levels"][level]] == [*SAMPLED, "chosen", "control_wall"]
    for arm in ("sft", *ARMS, "chosen", "control_wall"):  # three greedy tables, two sampled
        assert page.count(f"| {arm} |") == (3 if arm in ("chosen", "control_wall") else 5), page
    assert [r["model"] for r in result["sampled_pass_at_n"]] == SAMPLED
    throughput = result["grpo_throughput"]
    assert set(throughput) == {"grpo", "random"}
    assert all(arm["completions_per_s"] > 0 for arm in throughput.values()), throughput
