"""How a stage kind is declared: its config model, its input ports, what it produces, its
entry point (named by string, "module:function"), and the rest the pipeline reads.

Every kind, shipped or plugged in, is one `StageSpec`, registered once with
stages.registry.register. A plugged-in kind declares it at the end of its own module. A
shipped kind declares it here in the recipe schema, beside its config model (data_prep in
data.py; sft, dpo, distill in training.py; grpo in grpo.py; evaluate in evaluation.py;
hard_subset, self_teach, preferences, pick in subsets.py): the schema's `pipeline:` node union
is assembled from those declarations (nodes.py) and the registry registers exactly them (its
BUILTIN).

Why here and not in the stage's own module, as a plugin does: schemas/ imports nothing of FAR
and the registry imports no stage (import-linter contracts in pyproject.toml), because reading
a recipe and the registry must stay cheap (a stage module imports JAX and Tunix). The recipe
schema must know the shipped kinds' config models to type `pipeline:` nodes (so a bad config
names its field as `pipeline.1.sft.config.max_steps`, and the recipe's cross-section checks
read typed configs); declaring the whole kind beside its config model, with the entry point by
string, is the one place both the schema and the registry can read. No stage is imported
until a node of its kind runs (StageSpec.entry_point).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

ArtifactKind = Literal["dataset", "checkpoint", "eval_report", "preferences"]
# how an error (and the stage table) names an artifact kind
ARTIFACT_KIND_PHRASES: dict[str, str] = {
    "dataset": "a dataset",
    "checkpoint": "a checkpoint",
    "eval_report": "an eval report",
    "preferences": "preference pairs",
}
Section = Literal["data", "sft", "grpo", "eval"]


@dataclass(frozen=True)
class Port:
    """One input of a kind of node: the artifact kinds it accepts, the dataset splits it reads."""

    accepts: tuple[ArtifactKind, ...]
    splits: frozenset[str] = frozenset()
    required: bool = True
    producers: tuple[str, ...] = ()  # when set, only these node kinds may feed it
    # when set, the port reads the one split this field of the node's config names (evaluate's
    # `split`), not `splits` (the split when the config is left at its default)
    split_field: str | None = None
    # an eval report whose scored prompts the node trains on (hard_subset): the evaluation must
    # not score the held-out eval split, and must have evaluated the node's own `dataset`
    trains_on_scored: bool = False


@dataclass(frozen=True)
class StageSpec:
    """Everything the pipeline needs to know about one kind of stage."""

    kind: str  # the node's `kind` in a recipe; also its stage name in records
    config: type[BaseModel]  # the node's config model
    entry: str  # "module:function", the uniform run(inputs, config, ctx) -> StageOutcome
    produces: ArtifactKind
    ports: Mapping[str, Port] = field(default_factory=dict)
    splits: frozenset[str] = frozenset()  # a dataset producer: the splits its output holds
    any_other_input: Port | None = None  # evaluate: any other input name is a model to compare
    section: Section | None = None  # the recipe section a node without a config reads
    progress: bool = False  # long stages report per-step progress to the Prefect UI
    # config fields added after runs existed: hashed only when set to other than their default,
    # so stages hashed before the field existed keep their hash (and their directory)
    hash_exempt_defaults: tuple[str, ...] = ()
    summary: str = ""  # one line for the generated stage table

    @property
    def module(self) -> str:
        """The module holding the entry point (what the import contract lists as a stage)."""
        return self.entry.partition(":")[0]

    def entry_point(self) -> Callable[..., Any]:
        """The entry point, imported now (a stage module imports JAX and Tunix: seconds)."""
        module, _, name = self.entry.partition(":")
        function: Callable[..., Any] = getattr(importlib.import_module(module), name)
        return function

    def hashed_config(self, config: BaseModel) -> dict[str, Any]:
        """The config as its stage hash sees it: `hash_exempt_defaults` left out at default."""
        dumped = config.model_dump(mode="json")
        fields = type(config).model_fields
        for name in self.hash_exempt_defaults:
            if getattr(config, name) == fields[name].get_default(call_default_factory=True):
                del dumped[name]
        return dumped


DATASET_FOR = {
    "sft": Port(("dataset",), frozenset({"sft_train"})),
    "grpo": Port(("dataset",), frozenset({"grpo_train"})),
    "eval": Port(("dataset",), frozenset({"eval"})),
}
ALL_SPLITS = frozenset({"sft_train", "grpo_train", "eval", "validation"})
