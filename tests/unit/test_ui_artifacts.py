"""Prefect UI artifact helpers: valid keys, followable checkpoint links, the metrics table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flows.ui_artifacts import artifact_key, browsable_link, metrics_rows, run_label
from schemas.record import StageRecord
from stages.core.records import read_record
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from tests.conftest import recipe_with

PREFECT_KEY = re.compile(r"^[a-z0-9-]+$")  # what Prefect accepts as an artifact key


@pytest.mark.parametrize(
    ("run", "stage", "what", "expected"),
    [
        ("smoke", "data_prep", "data-card", "far-smoke-data-prep-data-card"),
        ("Gemma3-1B_v5e.8", "sft", "metrics", "far-gemma3-1b-v5e-8-sft-metrics"),
        ("demo", "evaluate", "report", "far-demo-evaluate-report"),
    ],
)
def test_artifact_keys_are_valid(run: str, stage: str, what: str, expected: str) -> None:
    key = artifact_key(run, stage, what)
    assert key == expected
    assert PREFECT_KEY.match(key)


def test_checkpoint_links() -> None:
    assert browsable_link("gs://bucket/runs/smoke/sft-abc/checkpoints") == (
        "https://console.cloud.google.com/storage/browser/bucket/runs/smoke/sft-abc/checkpoints"
    )
    assert browsable_link("/tmp/runs/smoke/sft-abc") == "file:///tmp/runs/smoke/sft-abc"
    assert browsable_link("memory://runs/x") == "memory://runs/x"


def _data_prep_record(root: str) -> StageRecord:
    recipe = recipe_with(root)
    outcome = data_prep.prepare(recipe.data, recipe.model, RunContext(root, "r"))
    record = read_record(outcome.record_uri)
    assert record is not None
    return record


def test_metrics_rows_show_status_then_every_recorded_metric(tmp_path: Path) -> None:
    record = _data_prep_record(str(tmp_path))
    rows = metrics_rows(record, skipped=True)
    assert rows[0] == {"metric": "status", "value": "skipped (complete on storage)"}
    assert rows[1]["metric"] == "seconds (when it ran)"
    assert [r["metric"] for r in rows[2:]] == sorted(record.metrics)
    for row in rows[2:]:
        assert row["value"] == pytest.approx(record.metrics[row["metric"]], rel=1e-5)
    assert metrics_rows(record, skipped=False)[0]["value"] == "ran"


def test_the_keys_the_docs_name_are_the_keys_far_makes() -> None:
    """Every `far-...` key docs/prefect-ui.md and docs/recipes.md give as an example is a key
    FAR publishes for the smoke or smoke-dag run under the docs' root (/tmp/far-docs-runs):
    the pages once named keys that did not exist."""
    from tests.conftest import REPO

    made = set()
    for run, nodes in (
        ("smoke", ("data_prep", "sft", "grpo", "evaluate")),
        ("smoke-dag", ("data_prep", "sft", "grpo", "evaluate", "evaluate_val", "pick")),
    ):
        label = run_label(run, f"/tmp/far-docs-runs/{run}")
        made |= {
            artifact_key(label, node, what)
            for node in nodes
            for what in ("summary", "metrics", "progress", "data-card", "checkpoint", "report")
        } | {artifact_key(label, "run", "ledger")}
    named = set()
    for page in ("prefect-ui.md", "recipes.md"):
        named |= set(re.findall(r"`(far-[a-z0-9-]+)`", (REPO / "docs" / page).read_text()))
    assert len(named) >= 8
    assert named <= made, sorted(named - made)


def test_runs_alike_under_two_roots_get_different_keys() -> None:
    """A run's label carries a short id of its URI: the same recipe under two storage roots
    gives two keys for every artifact, and one run keeps its label from session to session."""
    a, b = run_label("smoke", "/srv/alice/runs/smoke"), run_label("smoke", "gs://team/runs/smoke")
    assert a != b and a.startswith("smoke-") and b.startswith("smoke-")
    assert artifact_key(a, "evaluate", "report") != artifact_key(b, "evaluate", "report")
    assert run_label("smoke", "/srv/alice/runs/smoke") == a
    assert PREFECT_KEY.match(artifact_key(a, "evaluate", "report"))
