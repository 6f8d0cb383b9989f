"""Audit-grade records: content digests in every record, records sealed and never rewritten,
evaluations in their own write-once files, and `far audit` naming each kind of tampering.

The stages here are real `run_stage` calls whose work writes small files (no training): what
is under test is the record keeping, the same for every stage.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline import lineage
from pipeline.manifest import manifest_uri
from schemas.artifacts import CheckpointArtifact, EvalReport, ModelScores
from schemas.record import RunManifest, StageRecord
from stages.core import storage
from stages.core.runner import (
    EVALUATIONS_INDEX,
    RunContext,
    StageIdentity,
    read_evaluations,
    run_stage,
    with_uris,
)
from stages.evaluate import reports
from tests.conftest import recipe_with


def checkpoint_stage(ctx: RunContext, stage: Any, inputs: dict[str, str], uris: dict[str, str]):
    """A training-like stage: writes checkpoints/1/w and returns it as a checkpoint."""
    model = recipe_with(ctx.root).model

    def work(directory: str) -> tuple[CheckpointArtifact, dict[str, float], dict[str, list]]:
        ckpt = storage.join(directory, "checkpoints")
        storage.write_bytes(storage.join(ckpt, "1/w"), f"{stage}-weights-A".encode())
        artifact = CheckpointArtifact(
            uri=ckpt,
            step=1,
            model=model,
            tokenizer="byte",
            lora=None,
            size_bytes=sum(storage.list_files(ckpt).values()),
            fingerprint=storage.tree_fingerprint(ckpt),
        )
        return artifact, {"loss": 1.0}, {}

    identity = with_uris(StageIdentity(stage, 1, {"stage": stage}, inputs), **uris)
    return run_stage(ctx, identity, work)


def evaluate_stage(ctx: RunContext, checkpoint: CheckpointArtifact):
    def work(directory: str) -> tuple[EvalReport, dict[str, float], dict[str, list]]:
        score = ModelScores(
            name="sft",
            checkpoint_uri=checkpoint.uri,
            num_prompts=4,
            format_rate=0.5,
            accuracy=0.25,
            mean_completion_chars=10.0,
        )
        report_uri = storage.join(directory, "report.json")
        report = EvalReport(
            uri=report_uri, samples_uri=report_uri, scores=[score], fingerprint="f" * 64
        )
        storage.write_json(report_uri, report.model_dump(mode="json"))
        reports.record_scores(report, {"sft": checkpoint}, directory)
        return report, {"sft/accuracy": 0.25}, {}

    identity = StageIdentity("evaluate", 1, {}, {"sft": checkpoint.fingerprint})
    return run_stage(ctx, with_uris(identity, sft=checkpoint.uri), work)


@pytest.fixture
def run(tmp_path: Path) -> dict[str, Any]:
    ctx = RunContext(root=str(tmp_path), run="audited")
    recipe = recipe_with(str(tmp_path)).model_dump(mode="json")  # the default four-stage DAG
    manifest = RunManifest(
        run="audited", recipe=recipe, recipe_source="", created_at=datetime.now(UTC)
    )
    storage.write_json(manifest_uri(ctx.run_uri), manifest.model_dump(mode="json"))
    sft = checkpoint_stage(ctx, "sft", {}, {})
    fp = sft.output.fingerprint
    grpo = checkpoint_stage(ctx, "grpo", {"sft": fp}, {"sft": sft.output.uri})
    sft_record_bytes = Path(sft.record_uri).read_bytes()
    evaluation = evaluate_stage(ctx, sft.output)
    return {"ctx": ctx, "sft": sft, "grpo": grpo, "eval": evaluation, "sft_bytes": sft_record_bytes}


def test_records_hold_content_digests_and_seals(run: dict[str, Any]) -> None:
    record = StageRecord.model_validate(storage.read_json(run["sft"].record_uri))
    assert record.files["checkpoints/1/w"].digest.startswith("sha256:")
    assert record.digest is not None
    grpo = StageRecord.model_validate(storage.read_json(run["grpo"].record_uri))
    consumed = grpo.input_artifacts["sft"]
    assert consumed.record_uri == run["sft"].record_uri
    assert consumed.record_digest == storage.sha256_bytes(run["sft_bytes"])
    assert lineage.audit(run["ctx"].run_uri) == []


def test_evaluation_leaves_the_checkpoint_record_untouched(run: dict[str, Any]) -> None:
    assert Path(run["sft"].record_uri).read_bytes() == run["sft_bytes"]
    directory = run["sft"].record_uri.rsplit("/", 1)[0]
    [(uri, evaluation)] = read_evaluations(directory)
    eval_dir = run["eval"].record_uri.rsplit("/", 1)[0]
    assert uri == f"{directory}/evaluations/{eval_dir.rsplit('/', 1)[-1]}.json"
    assert evaluation.evaluation == eval_dir and evaluation.scores["accuracy"] == 0.25
    listed = storage.read_json(storage.join(eval_dir, EVALUATIONS_INDEX))
    assert listed == {uri: storage.sha256_bytes(Path(uri).read_bytes())}
    shown = lineage.render(lineage.ancestry(run["grpo"].output.uri))
    assert f"evaluated: format_rate=0.5, accuracy=0.25 ({uri})" in shown


def test_same_size_byte_change_moves_fingerprint_downstream_hash_and_audit(
    run: dict[str, Any],
) -> None:
    sft = run["sft"].output
    weights = Path(sft.uri, "1", "w")
    weights.write_bytes(b"sft-weights-B")  # same size as "sft-weights-A"
    changed = storage.tree_fingerprint(sft.uri)
    assert changed != sft.fingerprint
    before = StageIdentity("grpo", 1, {"stage": "grpo"}, {"sft": sft.fingerprint}).digest
    assert StageIdentity("grpo", 1, {"stage": "grpo"}, {"sft": changed}).digest != before
    assert lineage.audit(run["ctx"].run_uri) == [
        f"{Path(sft.uri).parent}/checkpoints/1/w: altered (size 13, recorded 13; "
        "content digest differs)"
    ]


def test_audit_names_an_edited_record(run: dict[str, Any]) -> None:
    path = Path(run["sft"].record_uri)
    edited = json.loads(path.read_text())
    edited["metrics"]["loss"] = 0.01
    path.write_text(json.dumps(edited, indent=2, sort_keys=True) + "\n")
    problems = lineage.audit(run["ctx"].run_uri)
    assert f"{path}: record edited after its commit (its digest no longer matches)" in problems
    assert any(p.startswith(f"{path}: record changed since grpo consumed it") for p in problems)


def test_audit_names_an_edited_evaluation_file(run: dict[str, Any]) -> None:
    directory = run["sft"].record_uri.rsplit("/", 1)[0]
    [(uri, _)] = read_evaluations(directory)
    edited = json.loads(Path(uri).read_text())
    edited["scores"]["accuracy"] = 0.99
    Path(uri).write_text(json.dumps(edited))
    assert lineage.audit(run["ctx"].run_uri) == [
        f"{uri}: evaluation file edited after it was written"
    ]
    Path(uri).unlink()
    assert lineage.audit(run["ctx"].run_uri) == [f"{uri}: evaluation file missing"]


def test_records_committed_before_named_digests_still_read() -> None:
    from schemas.record import FileDigest

    old = FileDigest.model_validate({"size": 3, "sha256": "ab" * 32})
    assert old.digest == "sha256:" + "ab" * 32


def test_the_ui_report_lists_the_evaluation_files(run: dict[str, Any]) -> None:
    from flows.ui_artifacts import evaluation_files_markdown

    report = run["eval"].output
    [(uri, _)] = read_evaluations(run["sft"].record_uri.rsplit("/", 1)[0])
    digest = storage.sha256_bytes(Path(uri).read_bytes())
    assert f"| `{uri}` | `{digest}` |" in evaluation_files_markdown(report)
