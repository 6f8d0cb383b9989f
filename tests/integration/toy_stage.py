"""A toy stage kind, added the way docs/adding-a-stage.md says: this one module, whose last line
registers it. Importing the module registers the kind; a recipe's YAML `pipeline:` can then
name it (tests/integration/test_toy_stage.py does, and unregisters it when done).

`first_prompts` keeps the first `keep` prompts of a dataset's grpo_train split and its eval
split as they are: a dataset a grpo node could train on, made without a model in a second.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from schemas.artifacts import Artifact, DatasetArtifact
from schemas.base import Frozen
from schemas.recipe import PositiveInt
from stages.core.datasets import load_prompts, write_derived_dataset
from stages.core.runner import (
    RunContext,
    StageIdentity,
    StageOutcome,
    require_input,
    run_stage,
    with_uris,
)
from stages.registry import Port, StageSpec, hashed_config, register

KIND = "first_prompts"
STAGE_VERSION = 1  # bump when a change alters what the stage computes from the same inputs


# 1. The config model (what a node's `config:` in the YAML is validated against).
class FirstPromptsConfig(Frozen):
    """Keep the first `keep` prompts of the grpo_train split."""

    keep: PositiveInt = 4
    """Prompts kept."""
    order: Literal["file", "id"] = "file"
    """Which prompts are first: the file's order, or sorted by id. Added after runs of this
    kind existed, so it is hashed only when set (SPEC.hash_exempt_defaults)."""


# 2. What determines the output (its digest names the directory), and the uniform entry point.
def identity(config: FirstPromptsConfig, dataset_fingerprint: str) -> StageIdentity:
    hashed = {KIND: hashed_config(KIND, config)}
    return StageIdentity(KIND, STAGE_VERSION, hashed, {"dataset": dataset_fingerprint})


def run(
    inputs: Mapping[str, Artifact], config: FirstPromptsConfig, ctx: RunContext
) -> StageOutcome[DatasetArtifact]:
    """The first `config.keep` prompts of `dataset` (or the committed result)."""
    dataset = require_input(inputs, "dataset", DatasetArtifact)

    def work(directory: str) -> tuple[DatasetArtifact, dict[str, float], dict[str, list[float]]]:
        rows = load_prompts(dataset, "grpo_train")
        if config.order == "id":
            rows = sorted(rows, key=lambda r: str(r["id"]))
        kept = rows[: config.keep]
        prompts = {"grpo_train": kept, "eval": load_prompts(dataset, "eval")}
        return write_derived_dataset(directory, dataset, prompts), {"kept": float(len(kept))}, {}

    stage = with_uris(identity(config, dataset.fingerprint), dataset=dataset.uri)
    return run_stage(ctx, stage, work)


# 3. The registration: the one line (a shipped kind's StageSpec goes in stages/registry.py's
# BUILTIN instead).
SPEC = register(
    StageSpec(
        KIND,
        FirstPromptsConfig,
        f"{__name__}:run",
        "dataset",
        {"dataset": Port(("dataset",), frozenset({"grpo_train", "eval"}))},
        splits=frozenset({"grpo_train", "eval"}),
        hash_exempt_defaults=("order",),
        summary="The first prompts of a dataset's grpo_train split.",
    )
)
