"""Audit-grade records: content digests in every record, records sealed and never rewritten,
evaluations in their own write-once files, and `far audit` naming each kind of tampering.

The stages here are real `run_stage` calls whose work writes small files (no training): what
is under test is the record keeping, the same for every stage.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from pipeline import lineage
from pipeline.manifest import manifest_uri, write_manifest
from schemas.artifacts import CheckpointArtifact, EvalReport, ModelScores
from schemas.record import RunManifest, StageRecord
from stages.core import ledger, storage
from stages.core.evaluations import EVALUATIONS_INDEX, read_evaluations, read_external_evaluations
from stages.core.records import record_digest
from stages.core.runner import RunContext, StageIdentity, run_stage, with_uris
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
    return make_run(tmp_path)


def make_run(tmp_path: Path, key: SecretStr | None = None) -> dict[str, Any]:
    ctx = RunContext(root=str(tmp_path), run="audited", audit_key=key)
    recipe = recipe_with(str(tmp_path)).model_dump(mode="json")  # the default four-stage DAG
    manifest = RunManifest(
        run="audited", recipe=recipe, recipe_source="", created_at=datetime.now(UTC)
    )
    write_manifest(ctx.run_uri, manifest, key)
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
    assert consumed.record_uri == "/".join(run["sft"].record_uri.rsplit("/", 2)[-2:])  # in run
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


def tree_bytes(folder: str) -> dict[str, bytes]:
    """Every file under `folder` by its relative path, with its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in Path(folder).rglob("*") if p.is_file()
    }


def scoring_run(root: Path) -> RunContext:
    """A second run, with its own run.json, that evaluates a checkpoint by URI."""
    ctx = RunContext(root=str(root), run="scorer")
    recipe = recipe_with(str(root)).model_dump(mode="json")
    manifest = RunManifest(
        run="scorer", recipe=recipe, recipe_source="", created_at=datetime.now(UTC)
    )
    write_manifest(ctx.run_uri, manifest)
    return ctx


def test_scoring_another_runs_checkpoint_writes_only_in_the_scoring_run(tmp_path: Path) -> None:
    first = make_run(tmp_path / "first")
    first_uri, sft = first["ctx"].run_uri, first["sft"]
    before = tree_bytes(first_uri)
    scorer = scoring_run(tmp_path / "second")
    outcome = evaluate_stage(scorer, sft.output)
    assert tree_bytes(first_uri) == before  # not one byte of the scored run changed
    assert lineage.audit(first_uri) == [] and lineage.audit(scorer.run_uri) == []
    eval_dir = outcome.record_uri.rsplit("/", 1)[0]
    [(uri, scored)] = read_external_evaluations(eval_dir)
    assert scored.checkpoint_record_uri == sft.record_uri
    assert scored.checkpoint_record_digest == storage.sha256_bytes(
        before[sft.record_uri.removeprefix(first_uri + "/")]
    )
    assert scored.checkpoint_fingerprint == sft.output.fingerprint
    assert scored.scores["accuracy"] == 0.25 and scored.evaluation == eval_dir
    record = StageRecord.model_validate(storage.read_json(outcome.record_uri))
    assert uri.removeprefix(eval_dir + "/") in record.files  # sealed with the scoring stage
    assert storage.read_json(storage.join(eval_dir, EVALUATIONS_INDEX)) == {}
    shown = lineage.render(lineage.ancestry(outcome.output.uri))
    assert (
        f"scored another run's checkpoint: format_rate=0.5, accuracy=0.25 ({sft.output.uri}; "
        f"record {scored.checkpoint_record_digest})"
    ) in shown
    # the scoring run's audit follows the scored checkpoint: its files, then its record
    weights = Path(sft.output.uri, "1", "w")
    weights.write_bytes(b"sft-weights-B")
    assert lineage.audit(scorer.run_uri) == [
        f"{uri}: evaluated checkpoint: {weights.parent.parent.parent}/checkpoints/1/w: altered "
        "(size 13, recorded 13; content digest differs)"
    ]
    weights.write_bytes(b"sft-weights-A")
    reseal(Path(sft.record_uri), lambda d: d["metrics"].update({"loss": 0.5}))
    assert lineage.audit(scorer.run_uri) == [
        f"{sft.record_uri}: record changed since evaluate consumed it (input sft of "
        f"{outcome.record_uri})",
        f"{uri}: the evaluated checkpoint's record {sft.record_uri} changed since it was read",
    ]


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


def reseal(path: Path, edit: Any) -> None:
    """What a writer with storage access does: edit a record and recompute its seal."""
    data = json.loads(path.read_text())
    edit(data)
    data["digest"] = record_digest(StageRecord.model_validate(data))
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def rebuild_ledger(run_uri: str, key: SecretStr | None = None) -> str:
    """...and then recomputes the whole ledger from the files as they are now."""
    storage.delete(ledger.ledger_uri(run_uri))
    ledger.append(run_uri, manifest_uri(run_uri), "manifest", key)
    for record_uri, _ in lineage.run_records(run_uri):
        ledger.append(run_uri, record_uri, "record", key)
    return str(ledger.root(run_uri))


def test_a_resealed_last_record_fails_the_audit_until_the_ledger_is_recomputed(
    run: dict[str, Any],
) -> None:
    run_uri, path = run["ctx"].run_uri, Path(run["eval"].record_uri)
    published = ledger.root(run_uri)
    assert published is not None
    reseal(path, lambda d: d["metrics"].update({"sft/accuracy": 0.99}))
    assert lineage.audit(run_uri) == [f"{path}: differs from its ledger entry 3 (rewritten)"]
    rebuild_ledger(run_uri)
    assert lineage.audit(run_uri) == []  # undetectable without a root kept elsewhere or a key
    assert "cannot be detected" in lineage.coverage(None, None)
    assert lineage.audit(run_uri, expect_root=published) == [
        f"{ledger.ledger_uri(run_uri)}: the expected root {published} is not in the ledger "
        "(the chain was rewritten since that root was published)"
    ]


def test_a_null_seal_is_refused(run: dict[str, Any]) -> None:
    path = Path(run["eval"].record_uri)
    data = json.loads(path.read_text())
    data["digest"] = None
    path.write_text(json.dumps(data))
    rebuild_ledger(run["ctx"].run_uri)
    assert lineage.audit(run["ctx"].run_uri) == [f"{path}: record has no seal (its digest is null)"]


def test_an_edited_run_json_fails_the_audit(run: dict[str, Any]) -> None:
    uri = manifest_uri(run["ctx"].run_uri)
    data = json.loads(Path(uri).read_text())
    data["recipe_source"] = "innocent.yaml"
    Path(uri).write_text(json.dumps(data))
    assert lineage.audit(run["ctx"].run_uri) == [
        f"{uri}: differs from its ledger entry 0 (rewritten)"
    ]


def test_removing_the_final_stage_with_its_evaluation_files_fails_the_audit(
    run: dict[str, Any],
) -> None:
    eval_dir = Path(run["eval"].record_uri).parent
    shutil.rmtree(eval_dir)
    shutil.rmtree(Path(run["sft"].record_uri).parent / "evaluations")
    assert lineage.audit(run["ctx"].run_uri) == [
        f"{eval_dir}/stage.json: stage record in the ledger (entry 3) is missing (removed)"
    ]


def test_a_signed_ledger_catches_a_chain_recomputed_without_the_key(tmp_path: Path) -> None:
    key = SecretStr("audit-key")
    signed = make_run(tmp_path, key)
    run_uri = signed["ctx"].run_uri
    assert lineage.audit(run_uri, key=key) == []
    assert lineage.audit(run_uri, key=SecretStr("another key"))[0].endswith(
        "signature does not match the key (rewritten without the key)"
    )
    reseal(Path(signed["eval"].record_uri), lambda d: d["metrics"].update({"sft/accuracy": 0.99}))
    rebuild_ledger(run_uri)
    problems = lineage.audit(run_uri, key=key)
    assert len(problems) == 4 and all("unsigned (rewritten without the key)" in p for p in problems)
    rebuild_ledger(run_uri, key)  # a writer who holds the key is not detected
    assert lineage.audit(run_uri, key=key) == []


def test_a_record_planted_in_a_checkpoint_folder_is_ignored(run: dict[str, Any]) -> None:
    sft = run["sft"]
    planted = Path(sft.output.uri) / "1" / "stage.json"
    forged = json.loads(Path(sft.record_uri).read_text())
    forged["metrics"]["loss"] = 0.0
    planted.write_text(json.dumps(forged))
    for uri in (str(planted.parent), sft.output.uri, f"{planted.parent}/w"):
        assert lineage.find_record(uri)[0] == sft.record_uri
    assert "loss=1" in lineage.render(lineage.ancestry(str(planted.parent)))
    assert lineage.audit(run["ctx"].run_uri) == [
        f"{planted}: not in the record (added after commit)"
    ]


def test_a_copied_run_audits_itself_after_the_original_is_gone(
    run: dict[str, Any], tmp_path: Path
) -> None:
    original = Path(run["ctx"].run_uri)
    copy = tmp_path / "elsewhere" / "audited"
    shutil.copytree(original, copy)
    shutil.rmtree(original)
    assert lineage.audit(str(copy)) == []
    shown = lineage.render(lineage.ancestry(str(copy / Path(run["grpo"].record_uri).parent.name)))
    assert f"record {copy}/sft-" in shown and "evaluated: format_rate=0.5" in shown
    weights = next(copy.glob("sft-*/checkpoints/1/w"))
    weights.write_bytes(b"sft-weights-B")
    assert lineage.audit(str(copy)) == [
        f"{weights}: altered (size 13, recorded 13; content digest differs)"
    ]


def test_records_with_absolute_paths_from_before_still_audit_after_a_copy(
    run: dict[str, Any], tmp_path: Path
) -> None:
    """Records written before paths were relative: absolute directory and input records."""
    original = run["ctx"].run_uri
    for record_uri, record in lineage.run_records(original):

        def absolute(d: dict[str, Any], where: str = record_uri) -> None:
            d["directory"] = where.rsplit("/", 1)[0]
            for ref in d["input_artifacts"].values():
                if ref["record_uri"]:
                    ref["record_uri"] = f"{original}/{ref['record_uri']}"
                    ref["record_digest"] = storage.sha256_file(ref["record_uri"])

        assert not record.directory.startswith("/")  # written relative now
        reseal(Path(record_uri), absolute)
    rebuild_ledger(original)
    assert lineage.audit(original) == []
    copy = tmp_path / "copied" / "audited"
    shutil.copytree(original, copy)
    shutil.rmtree(original)
    assert lineage.audit(str(copy)) == []
    shown = lineage.render(lineage.ancestry(str(copy / Path(run["grpo"].record_uri).parent.name)))
    assert f"record {copy}/sft-" in shown


def test_openlineage_events_carry_the_ledger_root(run: dict[str, Any]) -> None:
    events = lineage.openlineage_events(run["ctx"].run_uri)
    root = ledger.root(run["ctx"].run_uri)
    assert events and all(e["run"]["facets"]["far_ledger"]["root"] == root for e in events)


def test_far_audit_pins_a_root_reads_the_key_once_and_says_what_it_cannot_see(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows import cli

    run_uri = run["ctx"].run_uri
    root = str(ledger.root(run_uri))
    assert cli.main(["audit", run_uri]) == 0
    assert "a writer who can rewrite all of storage" in capsys.readouterr().out
    assert cli.main(["audit", run_uri, "--expect-root", root]) == 0
    assert "checked against the published root" in capsys.readouterr().out
    assert cli.main(["audit", run_uri, "--expect-root", "sha256:" + "0" * 64]) == 1
    monkeypatch.setenv(cli.AUDIT_KEY_ENV, "a key this run was not signed with")
    assert cli.main(["audit", run_uri]) == 1
    assert "unsigned (rewritten without the key)" in capsys.readouterr().out


def test_a_rerun_verifies_a_complete_stage_before_skipping_it(run: dict[str, Any]) -> None:
    from stages.core.errors import TamperedStage

    ctx, sft = run["ctx"], run["sft"]
    assert checkpoint_stage(ctx, "sft", {}, {}).skipped
    weights = Path(sft.output.uri, "1", "w")
    weights.write_bytes(b"sft-weights-B")  # same size as "sft-weights-A"
    with pytest.raises(TamperedStage, match=rf"{weights}: altered \(size 13, recorded 13"):
        checkpoint_stage(ctx, "sft", {}, {})
    weights.write_bytes(b"sft-weights-A")
    assert checkpoint_stage(ctx, "sft", {}, {}).skipped
    Path(sft.output.uri, "1", "extra").write_bytes(b"x")
    with pytest.raises(TamperedStage, match="extra: not in the record"):
        checkpoint_stage(ctx, "sft", {}, {})


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"sft": {"max_steps": 150}, "model": {"init_seed": 0}}, 150),
        ({"distill": {"max_steps": 7}, "model": {"init_seed": 0}}, 7),
        ({"data": {"seed": 0}, "model": {"tokenizer": "bytes"}}, None),
    ],
)
def test_a_partial_stage_of_any_training_kind_shows_its_max_steps(
    config: dict[str, Any], expected: int | None
) -> None:
    from pipeline.manifest import _max_steps

    assert _max_steps(config) == expected
