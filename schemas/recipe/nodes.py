"""The recipe's `pipeline:` nodes, assembled from the shipped kinds' declarations.

Each shipped kind is one StageSpec beside its config model (kinds.py says why there); its node
class here is made from that declaration, not written by hand: `kind: Literal["<kind>"]` and
`config: <its config model>` (optional, None meaning the recipe section the kind reads, when
it reads one; else its defaults when every config field has one; else required). The union
StageNode tags each class with its kind, so a YAML node is read by its kind's class and an
error's path names the kind (`pipeline.1.sft.config.max_steps`); a kind registered anywhere
else (a plugin's, a test's) is a RegisteredNode, whose config the DAG check validates against
its registration. stages/registry.py registers exactly SHIPPED_KINDS as its BUILTIN kinds, so
the schema's node union and the registry name the same kinds with the same config models.

Part of the recipe schema (schemas/recipe/__init__.py says how the package is laid out).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, cast

from pydantic import Discriminator, Field, Tag, create_model, field_validator

from schemas.base import Frozen
from schemas.recipe.common import NodeId
from schemas.recipe.data import DATA_PREP_KIND
from schemas.recipe.evaluation import EVALUATE_KIND
from schemas.recipe.grpo import GRPO_KIND
from schemas.recipe.kinds import StageSpec
from schemas.recipe.subsets import HARD_SUBSET_KIND, PICK_KIND, PREFERENCES_KIND, SELF_TEACH_KIND
from schemas.recipe.training import DISTILL_KIND, DPO_KIND, SFT_KIND

SHIPPED_KINDS: tuple[StageSpec, ...] = (
    DATA_PREP_KIND,
    SFT_KIND,
    GRPO_KIND,
    EVALUATE_KIND,
    HARD_SUBSET_KIND,
    SELF_TEACH_KIND,
    PREFERENCES_KIND,
    DPO_KIND,
    DISTILL_KIND,
    PICK_KIND,
)
"""The kinds FAR ships, in the order the stage table lists them; the registry's BUILTIN."""


class Node(Frozen):
    """One stage of a pipeline: its id (names its directory), and input name -> node id.

    Each shipped stage kind's node class adds `kind: Literal["<kind>"]` and `config: <its
    config model>`, made from its declaration (SHIPPED_KINDS). A kind registered anywhere
    else is a RegisteredNode."""

    id: NodeId
    """The node's id: names its directory, {id}-{hash}; lowercase, digits, '_'."""
    inputs: dict[str, NodeId] = Field(default_factory=dict)
    """Input name -> the id of the node whose output feeds it."""

    if TYPE_CHECKING:  # every node class declares both (RegisteredNode's config: a mapping)
        kind: str
        config: Any


def _node_name(spec: StageSpec) -> str:
    """The class name: its config model's (DPOConfig: DPONode) when that spells the kind, else
    the kind's words (evaluate: EvaluateNode)."""
    prefix = spec.config.__name__.removesuffix("Config")
    if prefix.lower() != spec.kind.replace("_", ""):
        prefix = "".join(word.capitalize() for word in spec.kind.split("_"))
    return f"{prefix}Node"


def _config_field(spec: StageSpec) -> tuple[Any, Any]:
    config = spec.config
    if spec.section is not None:  # evaluate (any other input: a model) compares the inputs
        said = ", models 'base' + the inputs" if spec.any_other_input is not None else ""
        described = f"None: the recipe's `{spec.section}`{said}"
        return config | None, Field(default=None, description=described)
    if any(field.is_required() for field in config.model_fields.values()):
        return config, ...
    return config, Field(default_factory=config)


def node_class(spec: StageSpec) -> type[Node]:
    """The node class of a shipped kind, made from its declaration."""
    kind: Any = Literal[spec.kind]  # a Literal of the declared kind: the union's tag
    made = create_model(
        _node_name(spec),
        __base__=Node,
        __module__=__name__,
        kind=(kind, ...),
        config=_config_field(spec),
    )
    return cast(type[Node], made)


SHIPPED_NODES: dict[str, type[Node]] = {spec.kind: node_class(spec) for spec in SHIPPED_KINDS}
"""Shipped kind -> its node class."""
# by name, for the code that reads one kind's nodes (pipeline/dag.py, the recipe's checks)
DataPrepNode = SHIPPED_NODES["data_prep"]
SFTNode = SHIPPED_NODES["sft"]
GRPONode = SHIPPED_NODES["grpo"]
EvaluateNode = SHIPPED_NODES["evaluate"]
HardSubsetNode = SHIPPED_NODES["hard_subset"]
SelfTeachNode = SHIPPED_NODES["self_teach"]
PreferencesNode = SHIPPED_NODES["preferences"]
DPONode = SHIPPED_NODES["dpo"]
DistillNode = SHIPPED_NODES["distill"]
PickNode = SHIPPED_NODES["pick"]


class RegisteredNode(Node):
    """A node of a kind this schema does not ship: one a plugin or a test registered
    (stages/registry.py). schemas/ imports nothing of FAR, so its config stays a mapping here;
    the DAG check (pipeline/dag.py) validates it against the config model of the kind's
    registration, and refuses a kind nothing registers, before any compute."""

    kind: str
    """The kind's name, as its registration spells it (the DAG check names the registered
    kinds when none is spelled so)."""
    config: dict[str, Any] | None = None
    """The config, as the registered kind's config model reads it; None: its defaults (or
    the recipe section its registration names)."""

    @field_validator("kind")
    @classmethod
    def _not_shipped(cls, value: str) -> str:
        if value in SHIPPED_NODES:
            raise ValueError(
                f"kind {value!r} is shipped with FAR: write it as a {SHIPPED_NODES[value].__name__}"
            )
        return value


REGISTERED = "registered"  # the tag of any kind the schema does not ship


def _node_tag(value: Any) -> str:
    """Which node class reads `value`: a shipped kind's own, else RegisteredNode."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if isinstance(kind, str) and kind in SHIPPED_NODES else REGISTERED


# A shipped kind's node is tagged with its kind (so an error's path reads pipeline.1.sft.config);
# any other kind is a RegisteredNode.
if TYPE_CHECKING:
    StageNode = Node
else:
    _TAGGED = tuple(Annotated[node, Tag(kind)] for kind, node in SHIPPED_NODES.items())
    StageNode = Annotated[
        Union[(*_TAGGED, Annotated[RegisteredNode, Tag(REGISTERED)])],
        Discriminator(_node_tag),
    ]
