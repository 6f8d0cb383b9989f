"""One error contract: what the user must fix is an InputError (exit 2, one line naming the
field or file and the fix) in every stage, never a bare ValueError or FileNotFoundError that
the CLI would show as a defect with a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from schemas.artifacts import DatasetArtifact, EvalReport
from schemas.recipe import HardSubsetConfig
from stages import distill, dpo, hard_subset, preferences
from stages.core.errors import InputError, MissingInput


def test_dpo_batch_larger_than_the_pairs() -> None:
    pair = {"chosen": np.zeros(2), "rejected": np.zeros(2)}
    with pytest.raises(InputError, match=r"dpo\.batch_size 4 exceeds the 1 preference pairs"):
        dpo.batches([pair], batch_size=4, seed=0)


def test_distill_batch_larger_than_the_rows() -> None:
    arrays = {"input_tokens": np.ones((2, 4), np.int32), "segment_ids": np.ones((2, 4), np.int32)}
    with pytest.raises(InputError, match=r"distill\.batch_size 3 exceeds the 2 SFT rows"):
        distill.batches(arrays, batch_size=3, seed=0)


def test_hard_subset_of_an_uncommitted_evaluation(tmp_path: Path) -> None:
    report = EvalReport(
        uri=str(tmp_path / "report.json"), samples_uri="", scores=[], fingerprint="f" * 64
    )
    # only the fingerprint is read before the refusal; the rest of the contract is not needed
    dataset = DatasetArtifact.model_construct(uri=str(tmp_path), fingerprint="d" * 64)
    with pytest.raises(MissingInput, match=r"report\.json is not committed"):
        hard_subset.check_evaluated_on(report, dataset)


def test_hard_subset_model_the_evaluation_does_not_hold() -> None:
    samples: list[dict[str, object]] = [{"model": "sft", "id": "1", "correct": 1.0}]
    with pytest.raises(InputError, match=r"no samples of model 'grpo'; it has \['sft'\]"):
        hard_subset.prompt_scores(samples, "grpo")
    with pytest.raises(InputError, match=r"min_prompts is 5"):
        hard_subset.hard_ids({"1": 1.0}, HardSubsetConfig(model="sft", min_prompts=5))


def test_preference_row_without_a_prompt() -> None:
    with pytest.raises(InputError, match=r"no prompt or instruction field: \['chosen'\]"):
        preferences.pair_from_row({"chosen": "a"}, "pairs")


def test_a_run_uri_that_holds_no_run(tmp_path: Path) -> None:
    from pipeline.manifest import read_manifest

    with pytest.raises(MissingInput, match=r"no FAR run at .*expected run\.json there"):
        read_manifest(str(tmp_path))


def test_an_unrendered_deployment_parameter() -> None:
    from flows.deployment import reject_unrendered_templates

    with pytest.raises(InputError, match=r"parameter name is an unrendered template"):
        reject_unrendered_templates({"name": "{{ $FAR_NAME }}"})
