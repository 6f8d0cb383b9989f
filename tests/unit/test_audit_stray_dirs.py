"""A directory added at a run's top level is a problem line of `far audit`: every directory
there is a stage directory ({node id}-{hash}) of a node of the run's DAG, or the run's own
MLflow store; anything else was put there by someone else. Runs are real `run_stage` calls
(tests/unit/test_records.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flows import cli
from pipeline import lineage
from pipeline.manifest import manifest_uri
from tests.unit.test_records import make_run


@pytest.fixture
def run(tmp_path: Path) -> dict[str, Any]:
    return make_run(tmp_path)


def _stray(run_uri: str, name: str) -> str:
    return (
        f"{run_uri}/{name}: directory at the run's top level that is no stage of the run's "
        f"DAG and not FAR's (added)"
    )


@pytest.mark.parametrize(
    "name",
    ["notes", "sft", "dpo-0123456789ab", "sft-0123456789ab-x", "SFT-0123456789ab", ".hidden"],
)
def test_a_stray_directory_is_a_problem(run: dict[str, Any], name: str) -> None:
    run_uri = run["ctx"].run_uri
    (Path(run_uri) / name).mkdir()
    (Path(run_uri) / name / "payload.bin").write_bytes(b"x")
    assert lineage.audit(run_uri) == [_stray(run_uri, name)]


def test_an_empty_stray_directory_is_a_problem_too(run: dict[str, Any]) -> None:
    run_uri = run["ctx"].run_uri
    (Path(run_uri) / "empty").mkdir()
    assert _stray(run_uri, "empty") in lineage.audit(run_uri)


def test_far_own_directories_are_not(run: dict[str, Any]) -> None:
    """A node's started, uncommitted directory (another hash) and the MLflow store are the
    run's own."""
    run_uri = run["ctx"].run_uri
    (Path(run_uri) / "data_prep-0123456789ab").mkdir()
    (Path(run_uri) / "mlflow").mkdir()
    (Path(run_uri) / "mlflow" / "mlflow.db").write_bytes(b"")
    assert lineage.audit(run_uri) == []


def test_with_a_torn_run_json_any_stage_name_passes(run: dict[str, Any]) -> None:
    """The DAG is unknown then: the torn file is the problem, stage-shaped names are not."""
    run_uri = run["ctx"].run_uri
    Path(manifest_uri(run_uri)).write_text('{"run": ')
    (Path(run_uri) / "dpo-0123456789ab").mkdir()
    (Path(run_uri) / "loot").mkdir()
    problems = lineage.audit(run_uri)
    assert _stray(run_uri, "loot") in problems
    assert not any("dpo-0123456789ab" in p for p in problems)


def test_far_audit_exits_with_problems(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    run_uri = run["ctx"].run_uri
    (Path(run_uri) / "stash").mkdir()
    assert cli.main(["audit", run_uri]) == cli.EXIT_PROBLEMS
    assert _stray(run_uri, "stash") in capsys.readouterr().out
