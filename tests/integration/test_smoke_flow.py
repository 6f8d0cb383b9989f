"""The smoke recipe end to end through the real Prefect flow, real Tunix, real Orbax; then
the same recipe again, which must skip every stage and return the same URIs. The two runs are
the session's `smoke_twice` (tests/conftest.py), which the Prefect UI test reads too."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from flows.ui_artifacts import artifact_key, run_label
from schemas.record import RunSummary, StageRecord
from stages.core import storage
from tests.conftest import SmokeRuns

pytestmark = pytest.mark.slow
STAGES = ["data_prep", "sft", "grpo", "evaluate"]


@pytest.fixture(scope="module")
def smoke_runs(smoke_twice: SmokeRuns) -> tuple[RunSummary, RunSummary]:
    return smoke_twice.first, smoke_twice.second


def test_first_run_runs_all_four_stages(smoke_runs: tuple[RunSummary, RunSummary]) -> None:
    first, _ = smoke_runs
    assert first.complete
    assert [s.stage for s in first.stages] == STAGES
    assert not any(s.skipped for s in first.stages)
    for line in first.stages:
        record = StageRecord.model_validate(storage.read_json(line.record_uri))
        assert record.status == "complete" and record.stage == line.stage
        assert record.output.uri == line.output_uri
        assert record.flow_run_id  # the Prefect flow run is named in every record
        assert record.code.packages["google-tunix"] == "0.1.7"


def test_rerun_skips_every_stage_with_same_outputs(
    smoke_runs: tuple[RunSummary, RunSummary],
) -> None:
    first, second = smoke_runs
    assert second.complete
    assert all(s.skipped for s in second.stages)
    assert [s.output_uri for s in second.stages] == [s.output_uri for s in first.stages]
    assert [s.record_uri for s in second.stages] == [s.record_uri for s in first.stages]


def test_checkpoints_are_real_orbax_lora_checkpoints(
    smoke_runs: tuple[RunSummary, RunSummary],
) -> None:
    first, _ = smoke_runs
    by_stage = {
        s.stage: StageRecord.model_validate(storage.read_json(s.record_uri)) for s in first.stages
    }
    for stage in ("sft", "grpo"):
        artifact = by_stage[stage].output
        assert artifact.kind == "checkpoint"
        files = storage.list_files(artifact.uri)
        assert any(f.startswith(f"{artifact.step}/model_params/") for f in files), stage
        assert artifact.lora is not None and artifact.size_bytes > 0


def test_sft_teaches_the_format(smoke_runs: tuple[RunSummary, RunSummary]) -> None:
    """The smoke recipe's point: a random model never emits the format; after SFT it does."""
    first, _ = smoke_runs
    report = StageRecord.model_validate(storage.read_json(first.stages[-1].record_uri)).output
    assert report.kind == "eval_report"
    scores = {s.name: s for s in report.scores}
    assert scores["base"].format_rate == 0.0
    assert scores["sft"].format_rate >= 0.5
    samples = storage.read_text(report.samples_uri).splitlines()
    assert len(samples) == 4 * scores["base"].num_prompts  # base, base-3shot, sft, grpo


def test_smoke_grpo_earns_reward_with_spread(smoke_runs: tuple[RunSummary, RunSummary]) -> None:
    """The smoke GRPO does visible work: some rollouts earn reward and some prompt group has
    reward variance (the only groups GRPO learns from). Before this was fixed its rollouts sampled
    random bytes at temperature 0.9, so every step's reward and informative fraction was 0."""
    first, _ = smoke_runs
    (grpo_line,) = [s for s in first.stages if s.stage == "grpo"]
    history = StageRecord.model_validate(storage.read_json(grpo_line.record_uri)).history
    steps = 4  # recipes/smoke.yaml
    assert len(history["rewards/score/mean"]) == len(history["far/informative_groups"]) == steps
    assert max(history["rewards/score/mean"]) > 0, history["rewards/score/mean"]
    assert max(history["rewards/format_strict"]) > 0, history["rewards/format_strict"]
    assert max(history["far/informative_groups"]) > 0, history["far/informative_groups"]
    # a group with spread has a best and a worst completion: the step's max and min differ
    spread = [
        hi - lo
        for hi, lo in zip(history["rewards/score/max"], history["rewards/score/min"], strict=True)
    ]
    assert max(spread) > 0, spread


def test_grpo_trained_the_sft_adapters(smoke_runs: tuple[RunSummary, RunSummary]) -> None:
    """GRPO starts from the SFT LoRA weights and changes them (greedy outputs may not move)."""
    import jax
    import numpy as np
    from flax import nnx

    from schemas.recipe import MeshSpec
    from stages.modeling import models

    first, _ = smoke_runs
    sft_ckpt, grpo_ckpt = (
        StageRecord.model_validate(storage.read_json(s.record_uri)).output
        for s in first.stages[1:3]
    )
    assert sft_ckpt.kind == grpo_ckpt.kind == "checkpoint"
    mesh = models.build_mesh(MeshSpec())
    base = models.build_base_model(sft_ckpt.model, mesh, "/nonexistent-cache-not-needed")
    adapters = [
        jax.tree.leaves(nnx.state(models.restore_policy(c, base, mesh), nnx.LoRAParam))
        for c in (sft_ckpt, grpo_ckpt)
    ]
    deltas = [
        float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(*adapters, strict=True)
    ]
    assert len(deltas) > 0 and max(deltas) > 0


def progress_artifacts(smoke: SmokeRuns, stage: str, flow_run_id: str) -> list[dict[str, Any]]:
    """The stage's progress artifacts made by one flow run, read from the server by key and
    flow run (the deployment test runs the smoke recipe on the same server too)."""
    key = artifact_key(run_label("smoke", smoke.first.run_uri), stage, "progress")
    body = {"artifacts": {"key": {"any_": [key]}, "flow_run_id": {"any_": [flow_run_id]}}}
    response = httpx.post(f"{smoke.api_url}/artifacts/filter", json=body, timeout=30)
    response.raise_for_status()
    return list(response.json())


def test_training_progress_is_shown_in_the_prefect_ui(smoke_twice: SmokeRuns) -> None:
    """Each training stage kept a progress artifact up to date while it ran (the re-run,
    which skipped both stages, made none)."""
    assert smoke_twice.first.complete
    steps = {"sft": 150, "grpo": 4}  # recipes/smoke.yaml
    for stage, total in steps.items():
        assert progress_artifacts(smoke_twice, stage, smoke_twice.second_id) == [], stage
        (artifact,) = progress_artifacts(smoke_twice, stage, smoke_twice.first_id)
        assert artifact["type"] == "progress" and float(artifact["data"]) == 100.0
        assert artifact["description"].startswith(f"{stage} {total}/{total} (100%)")
        assert "s/step | ETA 0 s" in artifact["description"]
        assert ("loss" if stage == "sft" else "reward") in artifact["description"]
        assert artifact["task_run_id"] is not None


def test_the_ledger_root_is_published_outside_storage_and_pins_the_run(
    smoke_twice: SmokeRuns,
) -> None:
    """Each session ends with the run's ledger root in its summary and a Prefect artifact; the
    second session's root pins the run; the first's names every entry the second appended
    (it skipped every stage, after verifying each: run.json only), accepted with accept_later."""
    from pipeline import lineage

    first, second = smoke_twice.first, smoke_twice.second
    assert first.ledger_root and second.ledger_root and first.ledger_root != second.ledger_root
    key = artifact_key(run_label("smoke", first.run_uri), "run", "ledger")
    body = {"artifacts": {"key": {"any_": [key]}}}
    response = httpx.post(f"{smoke_twice.api_url}/artifacts/filter", json=body, timeout=30)
    response.raise_for_status()
    assert any(second.ledger_root in str(a["description"]) for a in response.json())
    assert lineage.audit(first.run_uri, expect_root=second.ledger_root) == []
    later = lineage.audit(first.run_uri, expect_root=first.ledger_root)
    assert later and all("(run.json): appended after the expected root" in p for p in later)
    assert lineage.audit(first.run_uri, expect_root=first.ledger_root, accept_later=True) == []
    accepted = lineage.later_entries(first.run_uri, first.ledger_root)
    assert len(accepted) == len(later) and all(a.endswith("(manifest run.json)") for a in accepted)
