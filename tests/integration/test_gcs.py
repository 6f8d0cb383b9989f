"""The whole smoke recipe with a gs:// root, against fake-gcs-server on 127.0.0.1.

Everything goes through the real GCS JSON API: records and data via gcsfs, Orbax checkpoints
via TensorStore's GCS driver and epath (gcsfs), restores for GRPO and evaluation included.
"""

from __future__ import annotations

import pytest

from flows.far_flow import format_align_reinforce
from schemas.record import StageRecord
from stages.core import storage
from tests.conftest import recipe_with

pytestmark = [pytest.mark.slow, pytest.mark.gcs, pytest.mark.usefixtures("prefect_server")]


def test_storage_roundtrip_on_gcs(fake_gcs: str) -> None:
    uri = f"gs://{fake_gcs}/unit/a/stage.json"
    storage.write_json(uri, {"ok": True})
    assert storage.read_json(uri) == {"ok": True}
    size = len(storage.read_bytes(uri))
    assert storage.list_files(f"gs://{fake_gcs}/unit") == {"a/stage.json": size}
    with pytest.raises(FileNotFoundError, match="missing"):
        storage.read_bytes(f"gs://{fake_gcs}/unit/missing")


def test_smoke_recipe_on_gcs_runs_then_skips(fake_gcs: str) -> None:
    root = f"gs://{fake_gcs}/far"
    # the smoke recipe's stages at a few steps each (test_shared_weights' sizes: the same
    # compiled programs), every checkpoint written to gs:// and restored from it
    recipe = recipe_with(
        root,
        data={"eval": {"size": 8}, "grpo": {"size": 4}, "sft": {"size": 32}},
        sft={"max_steps": 4, "checkpoint_every_steps": 2},
        grpo={"max_steps": 2, "checkpoint_every_steps": 2, "max_generation_tokens": 8},
        eval={"max_generation_tokens": 8},
    )
    first = format_align_reinforce(recipe, root)
    assert first.complete and not any(s.skipped for s in first.stages)
    for line in first.stages:
        assert line.output_uri.startswith(f"gs://{fake_gcs}/far/smoke/")
        record = StageRecord.model_validate(storage.read_json(line.record_uri))
        assert record.status == "complete"
    grpo_ckpt = StageRecord.model_validate(storage.read_json(first.stages[2].record_uri)).output
    assert grpo_ckpt.kind == "checkpoint"
    assert any(f.startswith(f"{grpo_ckpt.step}/") for f in storage.list_files(grpo_ckpt.uri))
    second = format_align_reinforce(recipe, root)
    assert all(s.skipped for s in second.stages)
    assert [s.output_uri for s in second.stages] == [s.output_uri for s in first.stages]


def test_data_source_file_on_gcs(fake_gcs: str) -> None:
    import json

    from schemas.recipe import SourceSpec
    from stages.data_prep.adapters import ADAPTERS
    from stages.data_prep.sources import read_rows

    uri = f"gs://{fake_gcs}/data/gsm8k-sample.jsonl"
    rows = [
        {"question": f"What is {i} + 2?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"}
        for i in range(4)
    ]
    storage.write_text(uri, "".join(json.dumps(r) + "\n" for r in rows))
    spec = SourceSpec(kind="file", name=uri, adapter="gsm8k")
    answers = [ADAPTERS["gsm8k"](r, "gcs").answer for r in read_rows(spec, 0)]  # type: ignore[arg-type]
    assert answers == ["2", "3", "4", "5"]
