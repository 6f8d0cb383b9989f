"""A torn run.json (a write cut short, or an edit) stops `far status`, `far resume` and
`far run` with one line naming the file and what to do, exit 2, never a traceback; `far
audit` keeps reporting it as a problem line. Run through the real `far` executable."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flows import cli
from pipeline.manifest import manifest_uri, write_manifest
from schemas.record import RunManifest
from tests.conftest import REPO, SMOKE, recipe_with

FAR = str(Path(sys.executable).with_name("far"))


def torn_run(root: Path, content: bytes | None = None) -> str:
    """A real run.json of a smoke run under `root`, then cut in half (or replaced)."""
    run_uri = str(root / "smoke")
    made = RunManifest(
        run="smoke",
        recipe=recipe_with(str(root)).model_dump(mode="json"),
        recipe_source=str(SMOKE),
        created_at=datetime.now(UTC),
    )
    write_manifest(run_uri, made)
    path = Path(manifest_uri(run_uri))
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2] if content is None else content)
    return run_uri


def far(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FAR, *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=180,
    )


def _assert_one_line(done: subprocess.CompletedProcess[str], run_uri: str) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in done.stderr.splitlines() if "unreadable" in line]
    assert errors == [
        f"far: {manifest_uri(run_uri)} is unreadable (a torn write or an edit: "
        + errors[0].split("(a torn write or an edit: ", 1)[1]
    ], output
    assert "restore it from a copy, or start a new run under another --name" in errors[0]


@pytest.mark.parametrize("command", ["status", "resume", "run"])
def test_a_torn_run_json_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    run_uri = torn_run(tmp_path)
    argv = [command, run_uri] if command != "run" else ["run", str(SMOKE), "--root", str(tmp_path)]
    done = far(*argv, cwd=tmp_path)
    _assert_one_line(done, run_uri)
    assert not any(p.name.startswith("sft-") for p in Path(run_uri).iterdir())  # no compute


@pytest.mark.parametrize(
    "content", [b'{"run": "smoke"}', b"\xff\xfe not utf-8", b"[]"], ids=["schema", "bytes", "list"]
)
def test_a_run_json_of_another_shape_is_one_line_too(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    run_uri = torn_run(tmp_path, content)
    assert cli.main(["status", run_uri]) == 2
    err = capsys.readouterr().err
    assert f"{manifest_uri(run_uri)} is unreadable (a torn write or an edit: " in err
    assert "Traceback" not in err


def test_audit_still_lists_it_as_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_uri = torn_run(tmp_path)
    assert cli.main(["audit", run_uri]) == cli.EXIT_PROBLEMS
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "unreadable" in line]
    assert len(lines) == 1, out
    assert lines[0].startswith(f"{manifest_uri(run_uri)}: unreadable (a torn write or an edit): ")
    assert "restore it" not in lines[0]  # the parse error itself, not the command's advice
