"""Issue 37, round 3 of trust: what `far audit --expect-root` and `far status` make of a forgery
appended to the ledger, torn files, and a run copied elsewhere (its original deleted).

Runs are real `run_stage` calls on small files (tests/unit/test_records.py's `make_run`); every
forgery is what a writer with storage access does, with FAR's own functions.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from flows import cli
from pipeline import lineage
from pipeline.manifest import manifest_uri, run_status
from schemas.record import LedgerEntry
from stages.core import ledger, storage
from stages.core.errors import TamperedStage
from stages.core.records import (
    RECORD_NAME,
    directory_digests,
    find_checkpoint_record,
    located_output,
    read_record,
)
from stages.core.runner import RunContext
from tests.unit.test_records import checkpoint_stage, evaluate_stage, make_run, reseal


@pytest.fixture
def run(tmp_path: Path) -> dict[str, Any]:
    return make_run(tmp_path)


def forge_evaluation(run: dict[str, Any], accuracy: float) -> Path:
    """Copy the evaluate directory under a new hash, newer, with its accuracy raised; seal it
    and append it to the ledger."""
    original = Path(run["eval"].record_uri).parent
    forged = original.with_name("evaluate-" + "f" * 12)
    shutil.copytree(original, forged)
    identity = json.loads((forged / "identity.json").read_text())
    identity["created_at"] = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    (forged / "identity.json").write_text(json.dumps(identity))

    def edit(data: dict[str, Any]) -> None:
        data["stage_hash"] = "f" * 64
        data["directory"] = forged.name
        data["metrics"]["sft/accuracy"] = accuracy
        files = directory_digests(str(forged))
        data["files"] = {k: v.model_dump() for k, v in files.items()}

    reseal(forged / RECORD_NAME, edit)
    ledger.append(run["ctx"].run_uri, str(forged / RECORD_NAME), "record")
    return forged


def test_an_appended_forged_evaluation_fails_the_pinned_audit_and_is_never_current(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    run_uri = run["ctx"].run_uri
    published = str(ledger.root(run_uri))
    forged = forge_evaluation(run, 0.97)
    assert lineage.audit(run_uri) == []  # the ledger agrees with itself: only a root can tell
    assert lineage.audit(run_uri, expect_root=published) == [
        f"ledger entry 4 ({forged.name}/stage.json): appended after the expected root, so the "
        "root does not cover it (audit with the root published after it, or --accept-later)"
    ]
    assert lineage.audit(run_uri, expect_root=published, accept_later=True) == []
    assert lineage.later_entries(run_uri, published) == [
        f"accepted after the expected root: ledger entry 4 (record {forged.name}/stage.json)"
    ]
    states = run_status(run_uri, lineage.record_doubts(run_uri, None, published))
    evaluate = {s.state: s for s in states if s.stage == "evaluate"}
    assert evaluate["complete"].directory == str(Path(run["eval"].record_uri).parent)
    assert evaluate["unverified"].directory == str(forged)
    assert "after the expected root" in evaluate["unverified"].doubt

    assert cli.main(["audit", run_uri, "--expect-root", published]) == cli.EXIT_PROBLEMS
    assert "appended after the expected root" in capsys.readouterr().out
    assert cli.main(["audit", run_uri, "--expect-root", published, "--accept-later"]) == 0
    out = capsys.readouterr().out
    assert f"ledger entry 4 (record {forged.name}/stage.json)" in out
    assert cli.main(["status", run_uri, "--expect-root", published]) == 0
    out = capsys.readouterr().out
    assert "unverified" in out and f"{forged}" in out
    current = [line for line in out.splitlines() if " complete " in line and "evaluate" in line]
    assert current and str(forged) not in current[0]


def test_an_edited_run_json_with_an_appended_entry_fails_the_pinned_audit(
    run: dict[str, Any],
) -> None:
    run_uri = run["ctx"].run_uri
    published = str(ledger.root(run_uri))
    data = json.loads(Path(manifest_uri(run_uri)).read_text())
    data["recipe_source"] = "innocent.yaml"
    Path(manifest_uri(run_uri)).write_text(json.dumps(data))
    ledger.append(run_uri, manifest_uri(run_uri), "manifest")
    assert lineage.audit(run_uri) == []
    problems = lineage.audit(run_uri, expect_root=published)
    assert len(problems) == 1 and problems[0].startswith("ledger entry 4 (run.json): appended")


def test_an_older_root_fails_the_audit_naming_every_later_entry(run: dict[str, Any]) -> None:
    run_uri = run["ctx"].run_uri
    entries = ledger.read(run_uri)
    older = entries[1].root
    problems = lineage.audit(run_uri, expect_root=older)
    assert [p.split(":")[0] for p in problems] == [
        f"ledger entry {e.seq} ({e.path})" for e in entries[2:]
    ]
    doubts = lineage.record_doubts(run_uri, None, older)
    assert sorted(doubts) == sorted(
        storage.join(run_uri, e.path) for e in entries[2:] if e.kind == "record"
    )


def test_a_malformed_expect_root_is_a_bad_argument(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    run_uri = run["ctx"].run_uri
    for command in ("audit", "status"):
        assert cli.main([command, run_uri, "--expect-root", "7d3b72"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--expect-root" in err and "'7d3b72'" in err
    assert cli.main(["audit", run_uri, "--accept-later"]) == 2


def test_torn_files_are_problem_lines_and_the_audit_goes_on(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    run_uri = run["ctx"].run_uri
    ledger_path = Path(ledger.ledger_uri(run_uri))
    lines = ledger_path.read_text().splitlines()
    ledger_path.write_text("\n".join([*lines[:2], "\x00garbage{", *lines[2:]]) + "\n")
    grpo_record = Path(run["grpo"].record_uri)
    grpo_record.write_bytes(grpo_record.read_bytes()[:100])  # a full disk's torn write
    Path(manifest_uri(run_uri)).write_text("{not json")
    problems = lineage.audit(run_uri)
    assert any(p.startswith(f"{ledger_path}: line 3 is not a ledger entry") for p in problems)
    assert any(p.startswith(f"{grpo_record}: unreadable (a torn write") for p in problems)
    assert any(p.startswith(f"{manifest_uri(run_uri)}: unreadable") for p in problems)
    assert f"{grpo_record}: differs from its ledger entry 2 (rewritten)" in problems
    assert f"{manifest_uri(run_uri)}: differs from its ledger entry 0 (rewritten)" in problems
    assert cli.main(["audit", run_uri]) == cli.EXIT_PROBLEMS
    out = capsys.readouterr().out
    assert "audit of" in out and f"{len(problems)} problem(s)" in out


def test_the_ledger_refuses_a_path_leaving_the_run_and_the_audit_sees_added_top_files(
    run: dict[str, Any], tmp_path: Path
) -> None:
    run_uri = run["ctx"].run_uri
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    entries = ledger.read(run_uri)
    sha = storage.sha256_file(str(outside))
    path = "../outside.json"
    forged = {
        "seq": len(entries),
        "kind": "manifest",
        "path": path,
        "sha256": sha,
        "prev": entries[-1].root,
        "root": ledger.chain_root(entries[-1].root, "manifest", path, sha),
    }
    with open(ledger.ledger_uri(run_uri), "a") as f:
        f.write(json.dumps(forged) + "\n")
    sft_dir = Path(run["sft"].record_uri).parent.name
    directory = {
        **forged,
        "path": sft_dir,
        "root": ledger.chain_root(forged["prev"], "manifest", sft_dir, sha),
    }
    with open(ledger.ledger_uri(run_uri), "a") as f:
        f.write(json.dumps(directory) + "\n")
    (Path(run_uri) / "notes.txt").write_text("added")
    problems = lineage.audit(run_uri)
    assert (
        problems[0]
        == f"{run_uri}/notes.txt: file at the run's top level that no run writes (added)"
    )
    assert problems[1].startswith(f"{ledger.ledger_uri(run_uri)}: line 5 is not a ledger entry")
    assert "must be relative to the run" in problems[1]
    assert f"{run_uri}/{sft_dir}: differs from its ledger entry 4 (rewritten)" in problems
    with pytest.raises(ValueError, match="must be relative to the run"):
        LedgerEntry.model_validate({**forged, "path": "sft-0123456789ab/../../x"})


def copy_away(run: dict[str, Any], tmp_path: Path) -> Path:
    """The run copied elsewhere, its original deleted."""
    original = Path(run["ctx"].run_uri)
    copy = tmp_path / "moved" / original.name
    shutil.copytree(original, copy)
    shutil.rmtree(original)
    return copy


def test_a_copied_run_reads_its_own_outputs_after_the_original_is_gone(
    run: dict[str, Any], tmp_path: Path
) -> None:
    copy = copy_away(run, tmp_path)
    sft_dir = copy / Path(run["sft"].record_uri).parent.name
    for given in (sft_dir, sft_dir / "checkpoints"):  # what `far export` restores
        checkpoint = located_output(*find_checkpoint_record(str(given)))
        assert checkpoint.uri == f"{sft_dir}/checkpoints"
    ctx = RunContext(root=str(copy.parent), run=copy.name)
    again = checkpoint_stage(ctx, "sft", {}, {})  # a rerun in the copy skips it
    assert again.skipped and again.output.uri == f"{sft_dir}/checkpoints"
    evaluation = evaluate_stage(ctx, again.output)
    assert evaluation.skipped
    assert evaluation.output.samples_uri.startswith(f"{copy}/evaluate-")
    assert evaluation.output.scores[0].checkpoint_uri == f"{sft_dir}/checkpoints"
    shown = {s.stage: s.output_uri for s in run_status(str(copy))}
    assert all(uri is None or uri.startswith(f"{copy}/") for uri in shown.values())


def test_a_record_whose_output_leaves_its_stage_directory_is_refused(
    run: dict[str, Any], tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere" / "checkpoints"
    shutil.copytree(run["sft"].output.uri, outside)
    reseal(Path(run["sft"].record_uri), lambda d: d["output"].update({"uri": str(outside)}))
    with pytest.raises(TamperedStage, match="outside its run"):
        located_output(run["sft"].record_uri, read_record(run["sft"].record_uri))
    with pytest.raises(TamperedStage, match="outside its run"):
        checkpoint_stage(run["ctx"], "sft", {}, {})


def test_a_record_with_absolute_paths_from_before_reads_inside_its_copy(
    run: dict[str, Any], tmp_path: Path
) -> None:
    original = run["ctx"].run_uri
    record_uri = run["eval"].record_uri
    reseal(Path(record_uri), lambda d: d.update({"directory": record_uri.rsplit("/", 1)[0]}))
    copy = copy_away(run, tmp_path)
    moved = f"{copy}/{Path(record_uri).parent.name}/{RECORD_NAME}"
    record = lineage.find_record(moved)[1]
    assert record.directory.startswith(original)
    output = located_output(moved, record)
    assert output.uri == f"{copy}/{Path(record_uri).parent.name}/report.json"
    assert output.scores[0].checkpoint_uri.startswith(f"{copy}/sft-")
