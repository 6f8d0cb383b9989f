"""A session budget that cannot make progress (a red-team finding): refused before compute by
`far run`, `far resume` and `far validate` with the smallest budget that works, and a session
that still ends with no step taken says so with its own exit code (6) for a scheduler.

`flows.cli.main` runs in this process: the refusals come before any Prefect server or model."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows import cli
from flows.commands import run as run_command
from schemas.record import RunSummary, StageSummary
from stages.core.checkpoints import publish_session
from stages.core.runner import NoProgress, RunContext, SessionExpired, StageIdentity, run_stage
from stages.core.sessions import StopFlag
from tests.conftest import REPO

SMOKE = str(REPO / "recipes" / "smoke.yaml")


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("verb", ["run", "validate"])
def test_a_budget_below_one_step_and_the_save_margin_is_refused_before_compute(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    assert cli.main([verb, SMOKE, "--root", str(root), "session_budget=70s"]) == cli.EXIT_INVALID
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0  # one line
    assert "session_budget: 70 s cannot make progress" in err
    assert "save_margin_seconds" in err and "the smallest budget that works is 120s" in err
    assert not (root / "smoke").exists()  # nothing ran, nothing written


def test_far_resume_refuses_the_budget_it_would_inherit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run started with a tiny budget (written before this check) is not resumed with it."""
    from pipeline import manifest
    from pipeline.recipes import load_recipe

    recipe = load_recipe(SMOKE, {"storage_root": str(tmp_path), "session_budget": "70s"})
    ctx = RunContext(root=str(tmp_path), run="smoke")
    manifest.open_session(recipe, ctx, SMOKE, None, ())
    assert cli.main(["resume", ctx.run_uri]) == cli.EXIT_INVALID
    assert "the smallest budget that works is 120s" in capsys.readouterr().err


def test_the_smallest_budget_named_is_accepted(tmp_path: Path) -> None:
    assert cli.main(["validate", SMOKE, "--root", str(tmp_path), "session_budget=120s"]) == 0


def test_a_training_session_that_took_no_step_is_no_progress(tmp_path: Path) -> None:
    ckpt, logs = tmp_path / "ckpt", tmp_path / "logs"
    ckpt.mkdir()
    logs.mkdir()
    args: tuple[Any, ...] = (str(ckpt), str(tmp_path / "out"), str(logs), str(tmp_path / "tb"))
    with pytest.raises(NoProgress, match="stopped at step 50 of 150 without taking a step"):
        publish_session("SFT", 50, 150, *args, start_step=50)
    with pytest.raises(SessionExpired) as stopped:  # a step taken: progress, resumable
        publish_session("SFT", 51, 150, *args, start_step=50)
    assert not isinstance(stopped.value, NoProgress)


def test_a_stage_reached_after_the_deadline_is_no_progress(tmp_path: Path) -> None:
    ctx = RunContext(root=str(tmp_path), run="run", deadline=time.time() - 1)
    with pytest.raises(NoProgress, match="deadline passed before stage sft could start"):
        run_stage(ctx, StageIdentity("sft", 1, {}, {}), lambda d: (None, {}, {}))


def summary(no_progress: bool) -> RunSummary:
    line = StageSummary(
        stage="data_prep", output_uri="x", record_uri="x/stage.json", skipped=True, seconds=0.0
    )
    return RunSummary(
        run="smoke",
        run_uri="runs/smoke",
        complete=False,
        stages=[line],
        seconds=1.0,
        stopped_reason="SFT stopped at step 0 of 150 without taking a step",
        no_progress=no_progress,
    )


def test_a_session_without_progress_exits_6_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_command.exit_code(summary(no_progress=True)) == cli.EXIT_NO_PROGRESS == 6
    assert run_command.exit_code(summary(no_progress=False)) == cli.EXIT_INCOMPLETE
    run_command.print_summary(summary(no_progress=True))
    out = capsys.readouterr().out
    assert "INCOMPLETE, NO PROGRESS" in out and "longer --session-budget" in out
    assert "6 stopped at the session deadline without progress" in cli.EXIT_CODES


def test_only_a_deadline_stop_with_nothing_committed_is_no_progress(tmp_path: Path) -> None:
    from flows.far_flow import _made_no_progress

    ctx = RunContext(root=str(tmp_path), run="run", stop=StopFlag())
    skipped = summary(True).stages
    ran = [skipped[0].model_copy(update={"skipped": False})]
    assert _made_no_progress(ctx, skipped, NoProgress("step 0"))
    assert not _made_no_progress(ctx, ran, NoProgress("step 0"))  # data_prep committed
    assert not _made_no_progress(ctx, skipped, SessionExpired("step 3 of 150"))
    assert ctx.stop is not None
    ctx.stop.request("received signal SIGTERM")  # a preemption, not a budget too small
    assert not _made_no_progress(ctx, skipped, NoProgress("step 0"))
