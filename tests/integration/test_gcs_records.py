"""Content fingerprints on gs:// come from the objects' own GCS checksums (no download), and
see a change of bytes that keeps every size; against fake-gcs-server's real JSON API."""

from __future__ import annotations

import base64
import hashlib

import pytest

from stages.core import storage

pytestmark = [pytest.mark.gcs]


def test_gcs_digests_are_the_stored_md5_and_see_same_size_changes(fake_gcs: str) -> None:
    tree = f"gs://{fake_gcs}/fingerprints/checkpoints"
    storage.write_bytes(f"{tree}/1/w", b"weights-A")
    storage.write_bytes(f"{tree}/1/meta", b"{}")
    md5 = base64.b64encode(hashlib.md5(b"weights-A").digest()).decode()
    assert storage.file_digests(tree)["1/w"] == (9, f"md5:{md5}")
    before = storage.tree_fingerprint(tree)
    storage.write_bytes(f"{tree}/1/w", b"weights-B")
    assert storage.list_files(tree) == {"1/w": 9, "1/meta": 2}
    assert storage.tree_fingerprint(tree) != before


def test_audit_on_gcs_names_same_size_changes(fake_gcs: str) -> None:
    from datetime import UTC, datetime

    from pipeline import lineage
    from pipeline.manifest import write_manifest
    from schemas.record import RunManifest
    from stages.core.runner import RunContext, StageIdentity
    from tests.conftest import recipe_with
    from tests.unit.test_records import checkpoint_stage

    ctx = RunContext(root=f"gs://{fake_gcs}/audit", run="r")
    recipe = recipe_with(ctx.root).model_dump(mode="json")  # the default four-stage DAG
    manifest = RunManifest(run="r", recipe=recipe, recipe_source="", created_at=datetime.now(UTC))
    write_manifest(ctx.run_uri, manifest)  # chained into the ledger, as open_session does
    sft = checkpoint_stage(ctx, "sft", {}, {}).output
    grpo = checkpoint_stage(ctx, "grpo", {"sft": sft.fingerprint}, {"sft": sft.uri})
    assert grpo.output.uri.startswith("gs://")
    assert lineage.audit(ctx.run_uri) == []
    storage.write_bytes(f"{sft.uri}/1/w", b"sft-weights-B")  # same size
    changed = storage.tree_fingerprint(sft.uri)
    assert changed != sft.fingerprint
    downstream = StageIdentity("grpo", 1, {"stage": "grpo"}, {"sft": changed}).digest
    assert (
        downstream != StageIdentity("grpo", 1, {"stage": "grpo"}, {"sft": sft.fingerprint}).digest
    )
    [problem] = lineage.audit(ctx.run_uri)
    assert problem.startswith(f"{sft.uri}/1/w: altered")
