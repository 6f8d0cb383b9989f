"""The smoke recipe end to end through the real Prefect flow, real Tunix, real Orbax; then
the same recipe again, which must skip every stage and return the same URIs."""

from __future__ import annotations

import pytest

from flows.far_flow import format_align_reinforce
from schemas.record import RunSummary, StageRecord
from stages.core import storage
from tests.conftest import recipe_with

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]
STAGES = ["data_prep", "sft", "grpo", "evaluate"]


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunSummary, RunSummary]:
    root = str(tmp_path_factory.mktemp("smoke-root"))
    recipe = recipe_with(root)
    first = format_align_reinforce(recipe, storage.normalize(root))
    second = format_align_reinforce(recipe, storage.normalize(root))
    return first, second


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


def test_training_progress_is_shown_in_the_prefect_ui(
    smoke_runs: tuple[RunSummary, RunSummary],
) -> None:
    """Each training stage kept a progress artifact up to date while it ran (the re-run,
    which skipped both stages, made none)."""
    from prefect.artifacts import Artifact

    assert smoke_runs[0].complete
    steps = {"sft": 150, "grpo": 4}  # recipes/smoke.yaml
    for stage, total in steps.items():
        artifact = Artifact.get(f"far-smoke-{stage}-progress")
        assert artifact is not None, stage
        assert artifact.type == "progress" and float(artifact.data) == 100.0
        assert artifact.description.startswith(f"{stage} {total}/{total} (100%)")
        assert "s/step | ETA 0 s" in artifact.description
        assert ("loss" if stage == "sft" else "reward") in artifact.description
        assert artifact.task_run_id is not None


def test_the_ledger_root_is_published_outside_storage_and_pins_the_run(
    smoke_runs: tuple[RunSummary, RunSummary],
) -> None:
    """Each session ends with the run's ledger root in its summary and a Prefect artifact; a
    root kept from the first session still pins the run after the second (which skipped every
    stage, after verifying each)."""
    from prefect.artifacts import Artifact

    from pipeline import lineage

    first, second = smoke_runs
    assert first.ledger_root and second.ledger_root and first.ledger_root != second.ledger_root
    artifact = Artifact.get("far-smoke-run-ledger")
    assert artifact is not None and second.ledger_root in str(artifact.description)
    assert lineage.audit(first.run_uri, expect_root=first.ledger_root) == []
