"""far_scheduled's end states on a real Prefect API: a run stopped by its session budget is
COMPLETED-type and named "Incomplete" with the reason; an invalid recipe fails the run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows.deployment import INCOMPLETE_STATE_NAME, far_scheduled
from schemas.record import RunSummary
from tests.conftest import SMOKE, smoke_data

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_budget_spent_before_a_stage_ends_incomplete(tmp_path: Path) -> None:
    state = far_scheduled(str(SMOKE), str(tmp_path), session_budget="0.001s", return_state=True)
    assert state.is_completed() and state.name == INCOMPLETE_STATE_NAME
    assert state.message is not None and "deadline passed before stage data_prep" in state.message
    summary = state.result()
    assert isinstance(summary, RunSummary)
    assert not summary.complete and summary.stages == []


def test_invalid_recipe_fails_the_run(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**smoke_data(), "sft": {"max_steps": -1}}))
    state = far_scheduled(str(bad), str(tmp_path), return_state=True)
    assert state.is_failed()
    assert state.message is not None and "sft.max_steps" in state.message
