"""The recipe's `pipeline:` nodes: one class per shipped stage kind, and RegisteredNode for
a kind a plugin or a test registers.

Part of the recipe schema (schemas/recipe/__init__.py says how the package is laid out).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Discriminator, Field, Tag, field_validator

from schemas.base import Frozen
from schemas.recipe.common import NodeId
from schemas.recipe.data import DataPrepConfig
from schemas.recipe.evaluation import EvalConfig
from schemas.recipe.subsets import (
    HardSubsetConfig,
    PickConfig,
    PreferencesConfig,
    SelfTeachConfig,
)
from schemas.recipe.training import DistillConfig, DPOConfig, GRPOConfig, SFTConfig


class Node(Frozen):
    """One stage of a pipeline: its id (names its directory), and input name -> node id.

    Each shipped stage kind's node class adds `kind: Literal["<kind>"]` and `config: <its
    config model>`; its registration (stages/registry.py) declares the rest. A kind registered
    anywhere else is a RegisteredNode."""

    id: NodeId
    """The node's id: names its directory, {id}-{hash}; lowercase, digits, '_'."""
    inputs: dict[str, NodeId] = Field(default_factory=dict)
    """Input name -> the id of the node whose output feeds it."""


class DataPrepNode(Node):
    kind: Literal["data_prep"]
    config: DataPrepConfig | None = None
    """None: the recipe's `data`"""


class SFTNode(Node):
    kind: Literal["sft"]
    config: SFTConfig | None = None
    """None: the recipe's `sft`"""


class GRPONode(Node):
    kind: Literal["grpo"]
    config: GRPOConfig | None = None
    """None: the recipe's `grpo`"""


class EvaluateNode(Node):
    kind: Literal["evaluate"]
    config: EvalConfig | None = None
    """None: the recipe's `eval`, models 'base' + the inputs"""


class HardSubsetNode(Node):
    kind: Literal["hard_subset"]
    config: HardSubsetConfig


class SelfTeachNode(Node):
    kind: Literal["self_teach"]
    config: SelfTeachConfig = Field(default_factory=SelfTeachConfig)


class PreferencesNode(Node):
    kind: Literal["preferences"]
    config: PreferencesConfig = Field(default_factory=PreferencesConfig)


class DPONode(Node):
    kind: Literal["dpo"]
    config: DPOConfig


class DistillNode(Node):
    kind: Literal["distill"]
    config: DistillConfig


class PickNode(Node):
    kind: Literal["pick"]
    config: PickConfig


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
# any other kind is a RegisteredNode. tests/unit/test_registry.py checks that each tag is its
# class's kind and that the shipped kinds are exactly the registry's BUILTIN ones.
StageNode = Annotated[
    Annotated[DataPrepNode, Tag("data_prep")]
    | Annotated[SFTNode, Tag("sft")]
    | Annotated[GRPONode, Tag("grpo")]
    | Annotated[EvaluateNode, Tag("evaluate")]
    | Annotated[HardSubsetNode, Tag("hard_subset")]
    | Annotated[SelfTeachNode, Tag("self_teach")]
    | Annotated[PreferencesNode, Tag("preferences")]
    | Annotated[DPONode, Tag("dpo")]
    | Annotated[DistillNode, Tag("distill")]
    | Annotated[PickNode, Tag("pick")]
    | Annotated[RegisteredNode, Tag(REGISTERED)],
    Discriminator(_node_tag),
]
SHIPPED_NODES: dict[str, type[Node]] = {
    get_args(tagged)[1].tag: get_args(tagged)[0]
    for tagged in get_args(get_args(StageNode)[0])
    if get_args(tagged)[1].tag != REGISTERED
}
"""Shipped kind -> its node class, read off StageNode."""
