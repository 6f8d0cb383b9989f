"""Which recipe fields move each stage's hash (and so its directory), and which must not."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.recipe import HardSubsetConfig, Recipe
from stages import hard_subset, sft
from stages.core.decisions import stage_directory
from stages.core.runner import RunContext, StageIdentity
from stages.data_prep import build as data_prep
from stages.evaluate import evaluation as evaluate
from stages.grpo import training as grpo
from tests.conftest import recipe_with

FP_DATA, FP_SFT, FP_GRPO = "a" * 64, "b" * 64, "c" * 64


def digests(recipe: Recipe, fp_data: str = FP_DATA, fp_sft: str = FP_SFT) -> dict[str, str]:
    ids: dict[str, StageIdentity] = {
        "data_prep": data_prep.identity(recipe.data, recipe.model),
        "sft": sft.identity(recipe.sft, recipe.model, fp_data),
        "grpo": grpo.identity(recipe.grpo, recipe.model, fp_data, fp_sft),
        "evaluate": evaluate.identity(
            recipe.eval, recipe.model, fp_data, {"sft": fp_sft, "grpo": FP_GRPO}
        ),
    }
    return {name: identity.digest for name, identity in ids.items()}


BASE = recipe_with("/tmp/far-hash")

# (section, fields changed) -> the stages whose hash must move; all others must not.
CHANGES: list[tuple[str, dict[str, Any], set[str]]] = [
    ("data", {"seed": 1}, {"data_prep"}),
    ("data", {"max_seq_len": 200}, {"data_prep"}),
    ("sft", {"max_steps": 151}, {"sft"}),
    ("sft", {"learning_rate": 1e-4}, {"sft"}),
    ("sft", {"lora": {"rank": 4, "alpha": 8.0}}, {"sft"}),
    ("grpo", {"beta": 0.0}, {"grpo"}),
    ("grpo", {"rewards": {"format_strict": 2.0}}, {"grpo"}),
    ("grpo", {"seed": 1}, {"grpo"}),  # prompt order and every step's rollout seed
    ("grpo", {"samples_per_step": 8}, {"grpo"}),
    ("grpo", {"algorithm": "dr-grpo"}, {"grpo"}),
    ("grpo", {"max_grad_norm": None}, {"grpo"}),
    ("grpo", {"warmup_fraction": 0.0, "adam_b2": 0.999}, {"grpo"}),
    ("eval", {"max_generation_tokens": 16}, {"evaluate"}),
    ("eval", {"split": "grpo_train"}, {"evaluate"}),
    ("model", {"init_seed": 7}, {"sft", "grpo", "evaluate"}),
    ("model", {"dtype": "bfloat16"}, {"sft", "grpo", "evaluate"}),
    # where and when a run happens never changes what a stage computes:
    ("mesh", {"fsdp": 2}, set()),
    # the sandbox changes where a verdict is computed, not a correct verdict:
    ("sandbox", {"isolation": "process", "workers": 1}, set()),
    # where the curves are shown (TensorBoard, MLflow, W&B) is not what a stage computes:
    ("logging", {"tensorboard": False, "mlflow": True, "experiment": "other"}, set()),
]


@pytest.mark.parametrize(("section", "fields", "moved"), CHANGES)
def test_fields_that_move_stage_hashes(
    section: str, fields: dict[str, Any], moved: set[str]
) -> None:
    before = digests(BASE)
    after = digests(recipe_with("/tmp/far-hash", **{section: fields}))
    changed = {stage for stage in before if before[stage] != after[stage]}
    assert changed == moved


def test_storage_root_name_and_budget_do_not_move_hashes() -> None:
    moved = BASE.model_copy(update={"storage_root": "gs://b/x", "name": "other"})
    assert digests(moved) == digests(BASE)
    budget = recipe_with("/tmp/far-hash")
    assert digests(budget.model_copy(update={"session_budget": None})) == digests(BASE)


def test_upstream_fingerprints_move_downstream_only() -> None:
    before, after = digests(BASE), digests(BASE, fp_data="d" * 64)
    assert {s for s in before if before[s] != after[s]} == {"sft", "grpo", "evaluate"}
    after = digests(BASE, fp_sft="e" * 64)
    assert {s for s in before if before[s] != after[s]} == {"grpo", "evaluate"}


def test_stage_version_moves_hash() -> None:
    one = StageIdentity("sft", 1, {"x": 1}, {})
    two = StageIdentity("sft", 2, {"x": 1}, {})
    assert one.digest != two.digest


def test_directory_is_content_addressed_under_run() -> None:
    identity = sft.identity(BASE.sft, BASE.model, FP_DATA)
    ctx = RunContext(root="gs://bucket/far", run="smoke")
    assert stage_directory(ctx, "sft", identity.digest) == (
        f"gs://bucket/far/smoke/sft-{identity.digest[:12]}"
    )


def test_hash_is_stable_across_processes() -> None:
    """Pinned: a change here means every finished stage everywhere would be recomputed."""
    identity = StageIdentity("sft", 1, {"b": [1, 2], "a": {"z": None}}, {"dataset": FP_DATA})
    assert identity.digest == ("3367711d2b4f251e69cd7ea5778d31b1766b6259b681072cc3690931eca5291b")


def test_options_added_later_leave_default_hashes_alone() -> None:
    """eval.split (default: eval), eval.greedy, eval.rewards, eval.steps, eval.draw and
    eval.tag, sft's keep_checkpoints, hard_subset.above and hard_subset.by are not hashed at
    their defaults, and an sft without a policy has the inputs it always had, so stages made
    before either existed keep their directories; a policy to continue from moves the sft
    hash."""
    identity = evaluate.identity(BASE.eval, BASE.model, FP_DATA, {})
    assert "split" not in identity.config["eval"]
    later = {"split", "greedy", "rewards", "steps", "max_prompts", "draw", "tag"}
    assert set(identity.config["eval"]) == set(BASE.eval.model_dump()) - later
    headroom = BASE.eval.model_copy(update={"samples": 4, "temperature": 1.0, "greedy": True})
    moved = evaluate.identity(headroom, BASE.model, FP_DATA, {})
    assert moved.config["eval"]["greedy"] is True and moved.digest != identity.digest
    drawn = headroom.model_copy(update={"draw": "inverse_cdf"})
    assert evaluate.identity(drawn, BASE.model, FP_DATA, {}).digest != moved.digest
    fewer = BASE.eval.model_copy(update={"max_prompts": 8})
    assert evaluate.identity(fewer, BASE.model, FP_DATA, {}).digest != identity.digest
    every_step = BASE.eval.model_copy(update={"steps": "saved"})
    assert evaluate.identity(every_step, BASE.model, FP_DATA, {}).digest != identity.digest
    tagged = BASE.eval.model_copy(update={"tag": "k2"})
    assert evaluate.identity(tagged, BASE.model, FP_DATA, {}).digest != identity.digest
    scored = BASE.eval.model_copy(update={"rewards": ["format_strict"]})
    assert evaluate.identity(scored, BASE.model, FP_DATA, {}).digest != identity.digest
    plain = HardSubsetConfig(model="grpo")
    hard = hard_subset.identity(plain, FP_DATA, FP_DATA)
    assert set(hard.config["hard_subset"]) == {"model", "below", "min_prompts"}
    for changed in ({"above": 0.0}, {"by": "reward/format_strict"}):
        banded = HardSubsetConfig(model="grpo", **changed)
        assert hard_subset.identity(banded, FP_DATA, FP_DATA).digest != hard.digest
    fresh = sft.identity(BASE.sft, BASE.model, FP_DATA)
    assert fresh.inputs == {"dataset": FP_DATA}
    assert "keep_checkpoints" not in fresh.config["sft"]  # kept steps: hashed when not 2
    keep_all = BASE.sft.model_copy(update={"keep_checkpoints": 0})
    assert sft.identity(keep_all, BASE.model, FP_DATA).digest != fresh.digest
    assert fresh == sft.identity(BASE.sft, BASE.model, FP_DATA, None)
    continued = sft.identity(BASE.sft, BASE.model, FP_DATA, FP_SFT)
    assert continued.inputs == {"dataset": FP_DATA, "policy": FP_SFT}
    assert continued.digest != fresh.digest
