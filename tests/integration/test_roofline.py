"""bench/roofline.py end to end on the smoke recipe: every phase measured, counted and set
against the bound; the table and the JSON. Behaviour only, never a speed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.unit.test_roofline import roofline

pytestmark = pytest.mark.slow


def test_the_bench_runs_on_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = roofline.measure(
        "smoke", 4, 3, str(tmp_path / "cache"), xla=False, grpo_changes={"draw": "inverse_cdf"}
    )
    assert run["grpo"]["draw"] == "inverse_cdf" and run["grpo"]["max_steps"] == 3  # --grpo
    assert len(run["peaks"]) == 3 and len(run["load_average"]) == 3  # before SFT, GRPO, after
    for peaks in run["peaks"]:
        assert all(rate > 0 for rate in peaks.values())
    for phase in (
        "sft_step",
        "rollout_prefill",
        "rollout_decode",
        "reference_logps",
        "actor_update",
        "rewards",
    ):
        assert run["seconds"][phase] > 0, phase
    assert run["sft_tokens_per_s"] > 0 and run["sft_tokens_per_s_record"] > 0
    assert run["completion_only"] and 0 < run["decode_steps"] <= run["shapes"]["completion"]
    rows = roofline.table([run])
    by_phase = {row["phase"]: row for row in rows}
    for phase in ("sft_step", "rollout_prefill", "rollout_decode", "actor_update"):
        fraction = by_phase[phase]["fraction"]
        assert fraction is not None and math.isfinite(fraction) and fraction > 0, phase
    assert by_phase["rollout_decode"]["bound_by"] == "memory"
    assert by_phase["rewards"]["fraction"] is None  # host work: no model bound
    roofline.print_table("smoke", [run], rows)
    assert "rollout_decode" in capsys.readouterr().out
