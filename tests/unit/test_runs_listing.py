"""`far runs ROOT` reads each run's run.json, lease and ledger as plain data: how the last
session ended (complete, stopped, failed, running, crashed), or why run.json is unreadable."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flows.commands.runs import cmd_runs
from pipeline.runs import list_runs
from schemas.record import Invocation, LeaseHolder, RunManifest
from stages.core import storage


def _run(root: Path, name: str, outcome: str | None, sessions: int = 1) -> Path:
    now = datetime.now(UTC)
    invocations = [
        Invocation(started_at=now, flow_run_id=None, host="h", outcome=outcome)
        for _ in range(sessions)
    ]
    manifest = RunManifest(
        run=name,
        recipe={},
        recipe_source="recipes/smoke.yaml",
        created_at=now,
        invocations=invocations,
    )
    (root / name).mkdir(parents=True)
    (root / name / "run.json").write_text(manifest.model_dump_json())
    return root / name


def _lease(run: Path, expires_in: float) -> None:
    now = datetime.now(UTC)
    holder = LeaseHolder(
        token="t",
        host="h",
        pid=1,
        flow_run_id=None,
        acquired_at=now,
        expires_at=now + timedelta(seconds=expires_in),
    )
    (run / "lease.json").write_text(holder.model_dump_json())


def test_each_state_is_read_from_storage(tmp_path: Path) -> None:
    _run(tmp_path, "done", "complete", sessions=2)
    _run(tmp_path, "paused", "stopped: session budget")
    _run(tmp_path, "broke", "failed: InputError: bad")
    _lease(_run(tmp_path, "busy", None), expires_in=300)
    _lease(_run(tmp_path, "gone", None), expires_in=-300)  # a holder that stopped renewing
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "run.json").write_text('{"run": ')
    (tmp_path / "not-a-run").mkdir()
    listed = {r.run: r for r in list_runs(storage.normalize(str(tmp_path)))}
    assert sorted(listed) == ["broke", "busy", "done", "gone", "paused", "torn"]
    states = {name: r.state for name, r in listed.items()}
    assert states == {
        "done": "complete",
        "paused": "stopped",
        "broke": "failed",
        "busy": "running",
        "gone": "crashed",
        "torn": "unreadable",
    }
    assert listed["done"].sessions == 2 and listed["done"].ledger_root is None
    assert listed["broke"].detail == "failed: InputError: bad"
    assert listed["torn"].detail.startswith("run.json: ")


def test_a_missing_root_is_exit_2_and_json_lists_every_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from argparse import Namespace

    assert cmd_runs(Namespace(root=str(tmp_path / "nowhere"), json=False)) == 2
    assert "no storage root at" in capsys.readouterr().err
    _run(tmp_path, "done", "complete")
    assert cmd_runs(Namespace(root=str(tmp_path), json=True)) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["command"] == "runs" and [r["run"] for r in printed["runs"]] == ["done"]
