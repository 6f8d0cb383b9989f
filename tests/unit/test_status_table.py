"""`far status` on a run read from storage: its table's columns are as wide as their widest
cell (a node id longer than the old fixed width no longer pushes its row out of line), and a
partial evaluation says how many batches of completions it has kept, the only progress a
stopped evaluation has."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flows import cli
from flows.commands import status as status_command
from pipeline import manifest
from pipeline.manifest import write_manifest
from schemas.record import RunManifest
from tests.conftest import SMOKE, recipe_with


def _run_with_partial_evaluation(root: Path, batches: int) -> str:
    """A smoke run whose evaluate node has started and kept `batches` batches of sft's."""
    run_uri = str(root / "smoke")
    recipe = recipe_with(str(root))
    made = RunManifest(
        run="smoke",
        recipe=recipe.model_dump(mode="json"),
        recipe_source=str(SMOKE),
        created_at=datetime.now(UTC),
    )
    write_manifest(run_uri, made)
    directory = Path(run_uri) / "evaluate-0123456789ab"
    (directory / "progress" / "sft").mkdir(parents=True)
    identity = {"created_at": datetime.now(UTC).isoformat(), "config": {"evaluate": {}}}
    (directory / "identity.json").write_text(json.dumps(identity))
    for number in range(batches):
        (directory / "progress" / "sft" / f"batch-{number:05d}.json").write_text("{}")
    (directory / "progress" / "sft" / "batch-00099.json.tmp").write_text("")  # a torn write
    return run_uri


def test_a_partial_evaluation_shows_its_kept_batches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_uri = _run_with_partial_evaluation(tmp_path, batches=3)
    states = {s.stage: s for s in manifest.run_status(run_uri)}
    assert (states["evaluate"].state, states["evaluate"].batches) == ("partial", 3)
    assert states["sft"].batches is None

    assert cli.main(["status", run_uri]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    evaluate = next(row for row in rows if row.split()[0] == "evaluate")
    assert "3 batches kept" in evaluate, rows

    assert cli.main(["status", run_uri, "--json"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    assert {s["stage"]: s["batches"] for s in stages}["evaluate"] == 3


def test_columns_are_as_wide_as_their_widest_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    states = [
        manifest.StageState("data_prep", "complete", "/r/data_prep-1", sessions=1),
        manifest.StageState("a_long_node_name", "partial", "/r/a-2", step=3, max_steps=640),
        manifest.StageState("k2", "partial", "/r/k2-3", batches=1),
    ]
    status_command._print_table(states)
    rows = capsys.readouterr().out.splitlines()
    assert all(row == row.rstrip() for row in rows), rows
    # each row's directory starts in the same column, after the widest cell of each column
    starts = {row.index("/r/") for row in rows}
    assert len(starts) == 1, rows
    assert rows[1].split("  ")[1] == "a_long_node_name"
    assert "1 batch kept" in rows[2]
