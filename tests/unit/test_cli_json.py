"""`far status|lineage|audit|validate --json` (for scripts): one JSON object on stdout,
parsed back into its schema (schemas/cli_output.py) and checked against the text output's
facts, on real runs (tests/unit/test_records.py's `make_run`: real run_stage commits). And
none of these (nor `far recipes`) imports JAX: a child process runs them and says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows import cli
from pipeline import manifest
from schemas.cli_output import AuditOutput, LineageOutput, StatusOutput, ValidateOutput
from tests.conftest import REPO
from tests.unit.test_records import make_run
from tests.unit.test_validate_command import _started_run


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """`far` sets Prefect's defaults in os.environ (setdefault); keep them out of other tests."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def run(tmp_path: Path) -> dict[str, Any]:
    return make_run(tmp_path)


def far_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = cli.main([*argv, "--json"])
    out, _ = capsys.readouterr()
    return code, json.loads(out)  # the whole of stdout is one JSON object


def test_status_json(run: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    run_uri = run["ctx"].run_uri
    code, data = far_json(capsys, "status", run_uri)
    assert code == 0
    status = StatusOutput.model_validate(data)
    assert (status.schema_version, status.command, status.run) == (1, "status", "audited")
    expected = manifest.run_status(run_uri)
    assert [(s.stage, s.state) for s in status.stages] == [(s.stage, s.state) for s in expected]
    sft = next(s for s in status.stages if s.stage == "sft")
    assert sft.state == "complete" and sft.output_uri == run["sft"].output.uri
    assert "--expect-root" in status.coverage


def test_lineage_json(run: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, data = far_json(capsys, "lineage", run["grpo"].output.uri)
    assert code == 0
    lineage = LineageOutput.model_validate(data)
    top = lineage.artifact
    assert (top.kind, top.output_uri) == ("grpo", run["grpo"].output.uri)
    [parent] = top.parents
    assert (parent.name, parent.kind, parent.record_uri) == ("sft", "sft", run["sft"].record_uri)
    assert parent.evaluations[0].scores["accuracy"] == 0.25  # its evaluation file


def test_audit_json_ok_and_with_a_problem(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    run_uri = run["ctx"].run_uri
    code, data = far_json(capsys, "audit", run_uri)
    audit = AuditOutput.model_validate(data)
    assert code == 0 and audit.ok and audit.problems == [] and audit.records == 3
    weights = Path(run["sft"].record_uri).parent / "checkpoints" / "1" / "w"
    weights.write_bytes(b"altered")
    code, data = far_json(capsys, "audit", run_uri)
    audit = AuditOutput.model_validate(data)
    assert code == cli.EXIT_PROBLEMS and not audit.ok
    assert any(str(weights) in problem for problem in audit.problems), audit.problems


def test_validate_json_valid_and_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _started_run(tmp_path)
    code, data = far_json(capsys, "validate", path)
    plan = ValidateOutput.model_validate(data)
    assert code == 0 and plan.valid and plan.refused is None
    assert [(n.node, n.action) for n in plan.nodes] == [
        ("data_prep", "skip"),
        ("sft", "skip"),
        ("grpo", "continue"),
        ("evaluate", "run"),
    ]
    code = cli.main(["validate", path, "sft.max_steps=9", "--json"])
    out, err = capsys.readouterr()
    plan = ValidateOutput.model_validate_json(out)
    assert code == cli.EXIT_INVALID and not plan.valid
    assert plan.refused is not None and "sft.max_steps" in plan.refused
    assert err.strip() == f"far: {plan.refused}"  # the one line, as without --json


def test_an_input_error_prints_no_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["status", str(tmp_path / "nowhere"), "--json"])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_INVALID and out == "" and err.startswith("far: no FAR run at")


def test_read_only_commands_import_no_jax(run: dict[str, Any], tmp_path: Path) -> None:
    run_uri = run["ctx"].run_uri
    script = f"""
import sys
from flows import cli
for argv in (["status", {run_uri!r}, "--json"], ["audit", {run_uri!r}],
             ["lineage", {run["grpo"].output.uri!r}, "--json"], ["recipes"]):
    assert cli.main(argv) == 0, argv
print("jax imported:", "jax" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "jax imported: False"


# schema_version 1's fields: a new field keeps the version, a removed or renamed one must move
# it (and this pin with it), so a script written against version 1 keeps working.
V1_FIELDS = {
    StatusOutput: {
        "schema_version",
        "command",
        "run",
        "run_uri",
        "sessions",
        "last_outcome",
        "stages",
        "coverage",
    },
    LineageOutput: {"schema_version", "command", "uri", "run_uri", "artifact", "openlineage_file"},
    AuditOutput: {
        "schema_version",
        "command",
        "run_uri",
        "records",
        "files",
        "ok",
        "problems",
        "accepted_later",
        "coverage",
    },
    ValidateOutput: {
        "schema_version",
        "command",
        "recipe",
        "run",
        "run_uri",
        "valid",
        "refused",
        "nodes",
    },
}


@pytest.mark.parametrize("model", list(V1_FIELDS), ids=lambda m: m.__name__)
def test_version_1_fields_are_kept(model: Any) -> None:
    assert model.model_fields["schema_version"].default == 1
    missing = V1_FIELDS[model] - set(model.model_fields)
    assert not missing, f"{model.__name__} lost {missing}: bump SCHEMA_VERSION and this pin"
