"""`far status` after a run that ended on an input error found inside the run (bad data at
data_prep): the session is noted as failed with its reason, never "running or crashed"."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows import cli
from pipeline.manifest import read_manifest
from tests.conftest import smoke_data

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("prefect_server")
def test_status_names_the_failure_of_the_last_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "words.jsonl"
    source.write_text('{"question": "q?", "answer": "#### four"}\n')
    data = smoke_data()
    data["data"]["eval"] = {
        "size": 2,
        "sources": [{"kind": "file", "name": str(source), "adapter": "gsm8k"}],
    }
    data["storage_root"] = str(tmp_path / "runs")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data))
    assert cli.main(["run", str(recipe)]) == cli.EXIT_INVALID
    capsys.readouterr()
    run_uri = str(tmp_path / "runs" / data["name"])
    [session] = read_manifest(run_uri).invocations
    assert session.outcome is not None and session.outcome.startswith("failed: ")
    assert "'four' is not a number" in session.outcome
    assert cli.main(["status", run_uri]) == 0
    out = capsys.readouterr().out
    assert "last: failed: " in out and "running or crashed" not in out
