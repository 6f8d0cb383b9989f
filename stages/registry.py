"""The stage registry: one registration per stage kind, and everything about a kind read from it.

A `StageSpec` declares a kind of pipeline node in one place: its config model, its input ports
(the artifacts and dataset splits each accepts), what it produces, its entry point, whether it
reports per-step progress to the UI, the recipe section a node without its own config reads,
and which config fields are hashed only when set. The DAG checker (pipeline/dag.py), the node
runner (pipeline/nodes.py), the flow (flows/far_flow.py), `far validate` (pipeline/plan.py),
the generated stage table (flows/gen_docs.py) and the import contract's stage list (checked
by tests/unit/test_registry.py) all read `REGISTRY`; none of them names a kind in a table.

Every entry point has one shape, `run(inputs, config, ctx) -> StageOutcome`: `inputs` the
upstream artifacts keyed by port name, `config` the node's config (an instance of the spec's
`config`), `ctx` the RunContext with the node id, the recipe's model and mesh. An entry point
is named by "module:function" and imported only when a node of its kind runs: this module
imports no stage, so reading the registry (validating a recipe, drawing the DAG) stays cheap.

Adding a stage kind is one module (its config model and `run`) plus one line: `register(...)`
at the end of that module (a plugin's or a test's kind, imported by `--plugin MODULE` or the
recipe's `plugins:` through pipeline/plugins.py; a recipe's YAML then names it, read as
a schemas.recipe.RegisteredNode whose config pipeline/dag.py validates against the registered
model), or, for a kind shipped with FAR, its StageSpec in `BUILTIN` below. The steps are in
docs/adding-a-stage.md, which tests/integration/test_toy_stage.py follows. `SHARED_LAYERS`
declares what else sits under stages/.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from schemas.recipe import (
    DataPrepConfig,
    DistillConfig,
    DPOConfig,
    EvalConfig,
    GRPOConfig,
    HardSubsetConfig,
    PickConfig,
    PreferencesConfig,
    SelfTeachConfig,
    SFTConfig,
)
from stages.core.errors import InputError

ArtifactKind = Literal["dataset", "checkpoint", "eval_report", "preferences"]
SAYS: dict[str, str] = {  # how an error (and the stage table) names an artifact kind
    "dataset": "a dataset",
    "checkpoint": "a checkpoint",
    "eval_report": "an eval report",
    "preferences": "preference pairs",
}
Section = Literal["data", "sft", "grpo", "eval"]


class UnknownStageKind(InputError):
    """A node of a kind no registration declares."""


class PluginError(InputError):
    """A plugin module (--plugin, a recipe's plugins) that cannot be imported, or registers
    neither a stage kind nor a reward (pipeline/plugins.py loads them)."""


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
    config: type[BaseModel]  # the node's config model (schemas/recipe.py)
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

# The built-in stage kinds, one registration each, in the order the stage table lists them.
BUILTIN: tuple[StageSpec, ...] = (
    StageSpec(
        "data_prep",
        DataPrepConfig,
        "stages.data_prep.build:run",
        "dataset",
        splits=ALL_SPLITS,  # validation only when the config sets it (pipeline/dag.py)
        section="data",
        hash_exempt_defaults=("validation", "prompt"),
        summary="Draws, tokenizes and splits the examples.",
    ),
    StageSpec(
        "sft",
        SFTConfig,
        "stages.sft:run",
        "checkpoint",
        {"dataset": DATASET_FOR["sft"], "policy": Port(("checkpoint",), required=False)},
        section="sft",
        progress=True,
        hash_exempt_defaults=("keep_checkpoints",),
        summary="Supervised format training (LoRA), from the base or a `policy`.",
    ),
    StageSpec(
        "grpo",
        GRPOConfig,
        "stages.grpo.training:run",
        "checkpoint",
        {"dataset": DATASET_FOR["grpo"], "policy": Port(("checkpoint",))},
        section="grpo",
        progress=True,
        hash_exempt_defaults=("flat_groups", "keep_checkpoints", "baseline"),
        summary="Reinforcement on the rewards (GRPO and its variants).",
    ),
    StageSpec(
        "evaluate",
        EvalConfig,
        "stages.evaluate.evaluation:run",
        "eval_report",
        {"dataset": Port(("dataset",), frozenset({"eval"}), split_field="split")},
        any_other_input=Port(("checkpoint",)),
        section="eval",
        progress=True,
        hash_exempt_defaults=("split", "greedy", "rewards", "steps"),
        summary="Format rate and accuracy of each model compared.",
    ),
    StageSpec(
        "hard_subset",
        HardSubsetConfig,
        "stages.hard_subset:run",
        "dataset",
        {  # the dataset: the evaluated one (its grpo_train) and its eval split
            "evaluation": Port(("eval_report",), producers=("evaluate",), trains_on_scored=True),
            "dataset": Port(("dataset",), frozenset({"grpo_train", "eval"})),
        },
        splits=frozenset({"grpo_train", "eval"}),
        hash_exempt_defaults=("above", "by", "select", "right_share"),
        summary="The training prompts an evaluation says are still hard.",
    ),
    StageSpec(
        "self_teach",
        SelfTeachConfig,
        "stages.self_teach:run",
        "dataset",
        {"dataset": DATASET_FOR["grpo"], "policy": Port(("checkpoint",))},
        splits=ALL_SPLITS,
        summary="SFT rows from a policy's own completions that the rewards verify.",
    ),
    StageSpec(
        "preferences",
        PreferencesConfig,
        "stages.preferences:run",
        "preferences",
        {  # none: pairs from config.file
            "samples": Port(
                ("eval_report", "checkpoint"), required=False, producers=("evaluate", "grpo")
            ),
            "dataset": Port(("dataset",), frozenset({"eval"}), required=False),
        },
        hash_exempt_defaults=("pairing",),
        summary="Preference pairs from a file or from sampled completions.",
    ),
    StageSpec(
        "dpo",
        DPOConfig,
        "stages.dpo:run",
        "checkpoint",
        {"policy": Port(("checkpoint",)), "preferences": Port(("preferences",))},
        hash_exempt_defaults=("keep_checkpoints",),
        summary="DPO or ORPO on preference pairs.",
    ),
    StageSpec(
        "distill",
        DistillConfig,
        "stages.distill:run",
        "checkpoint",
        {"dataset": DATASET_FOR["sft"], "teacher": Port(("checkpoint",))},
        hash_exempt_defaults=("keep_checkpoints",),
        summary="Logit distillation of a teacher into a student.",
    ),
    StageSpec(
        "pick",
        PickConfig,
        "stages.pick:run",
        "checkpoint",
        {"evaluation": Port(("eval_report",), producers=("evaluate",))},
        any_other_input=Port(("checkpoint",)),
        summary="The policy with the best greedy accuracy on the validation split.",
    ),
)

# What else sits directly under stages/ beside the stage kinds: the layers every stage shares,
# which import no stage (the import contract in pyproject.toml enforces it), and this registry.
# They stay under stages/ because their paths are part of FAR's interface (a recipe's reward
# names resolve in stages/rewards; stages/modeling/tunix_compat.py is named by the mission).
# tests/unit/test_registry.py fails when a package or module under stages/ is neither a
# registered kind's, a shared layer nor the registry, or when the import contract's lists
# disagree with this declaration and BUILTIN.
SHARED_LAYERS: tuple[str, ...] = ("stages.core", "stages.modeling", "stages.rewards")
"""The shared layers, lowest first: storage, records and datasets; models; rewards."""

REGISTRY: dict[str, StageSpec] = {}


class DuplicateKind(PluginError, ValueError):
    """A stage kind registered twice (two plugins, or a plugin naming a shipped kind)."""


def register(spec: StageSpec) -> StageSpec:
    """Add a stage kind; a kind registered twice is refused."""
    if spec.kind in REGISTRY:
        raise DuplicateKind(
            f"stage kind {spec.kind!r} is registered already (by {REGISTRY[spec.kind].module}); "
            f"a second registration must give its kind another name"
        )
    if ":" not in spec.entry:
        raise ValueError(f"stage kind {spec.kind!r}: entry must be 'module:function'")
    unknown = sorted(set(spec.hash_exempt_defaults) - set(spec.config.model_fields))
    if unknown:
        raise ValueError(
            f"stage kind {spec.kind!r}: hash_exempt_defaults {unknown} are not fields of "
            f"{spec.config.__name__}"
        )
    if any(p.trains_on_scored for p in spec.ports.values()) and "dataset" not in spec.ports:
        raise ValueError(
            f"stage kind {spec.kind!r}: a port that trains on scored prompts needs a 'dataset' "
            f"port (the dataset the evaluation scored)"
        )
    REGISTRY[spec.kind] = spec
    return spec


def spec(kind: str) -> StageSpec:
    """The registration of `kind`; UnknownStageKind names the registered ones."""
    found = REGISTRY.get(kind)
    if found is None:
        close = difflib.get_close_matches(kind, sorted(REGISTRY), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownStageKind(
            f"no stage kind {kind!r} is registered; kinds: {sorted(REGISTRY)}{hint}"
        )
    return found


def unregister(kind: str) -> None:
    """Remove a kind registered with `register` (a test's, when it ends); built-ins stay."""
    if kind in {s.kind for s in BUILTIN}:
        raise ValueError(f"stage kind {kind!r} is built in and cannot be unregistered")
    REGISTRY.pop(kind, None)


def check_entry(plugin: str, spec: StageSpec) -> None:
    """The entry point of a kind `plugin` registered imports; else PluginError naming both."""
    try:
        spec.entry_point()
    except (Exception, SystemExit) as e:
        raise PluginError(
            f"{plugin}: stage kind {spec.kind!r} names entry point {spec.entry!r}, "
            f"which cannot be imported ({type(e).__name__}: {e}); expected 'module:function' "
            f"of a function in an importable module"
        ) from e


@contextmanager
def registered(extra: StageSpec) -> Iterator[StageSpec]:
    """`extra` registered for the duration of the block (a test's stage kind), then removed."""
    register(extra)
    try:
        yield extra
    finally:
        unregister(extra.kind)


def hashed_config(kind: str, config: BaseModel) -> dict[str, Any]:
    """`config` as the stage hash of `kind` sees it (see StageSpec.hash_exempt_defaults)."""
    return spec(kind).hashed_config(config)


for _builtin in BUILTIN:
    register(_builtin)
