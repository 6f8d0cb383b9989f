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

Adding a stage kind is one declaration (a StageSpec: config model, ports, entry point)
registered once. A plugin's or a test's kind declares it in its own module, whose last line is
`register(...)` (imported by `--plugin MODULE` or the recipe's `plugins:` through
pipeline/plugins.py; a recipe's YAML then names it, read as a schemas.recipe.RegisteredNode
whose config pipeline/dag.py validates against the registered model). A kind shipped with FAR
declares the same StageSpec beside its config model in the recipe schema
(schemas/recipe/kinds.py says why there), listed once in schemas.recipe.SHIPPED_KINDS, from
which the schema assembles its node union and this module takes BUILTIN. The steps are in
docs/adding-a-stage.md, which tests/integration/test_toy_stage.py follows. `SHARED_LAYERS`
declares what else sits under stages/.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel

from schemas.recipe import SHIPPED_KINDS

# the declaration's parts, defined with the shipped kinds' declarations (one import for a plugin)
from schemas.recipe.kinds import ALL_SPLITS as ALL_SPLITS
from schemas.recipe.kinds import ARTIFACT_KIND_PHRASES as ARTIFACT_KIND_PHRASES
from schemas.recipe.kinds import DATASET_FOR as DATASET_FOR
from schemas.recipe.kinds import ArtifactKind as ArtifactKind
from schemas.recipe.kinds import Port as Port
from schemas.recipe.kinds import Section as Section
from schemas.recipe.kinds import StageSpec
from stages.core.errors import InputError, closest


class UnknownStageKind(InputError):
    """A node of a kind no registration declares."""


class PluginError(InputError):
    """A plugin module (--plugin, a recipe's plugins) that cannot be imported, or registers
    neither a stage kind nor a reward (pipeline/plugins.py loads them)."""


# The kinds shipped with FAR: each declared beside its config model in the recipe schema
# (schemas/recipe/kinds.py says why there), from which the schema's node union is assembled too.
BUILTIN: tuple[StageSpec, ...] = SHIPPED_KINDS

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
        close = closest(kind, REGISTRY)
        hint = f"; did you mean {close!r}?" if close else ""
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
