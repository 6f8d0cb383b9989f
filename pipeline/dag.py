"""The run's stages as a DAG: which nodes, what feeds each, and whether the graph can run.

A recipe's `pipeline:` lists nodes {id, kind, inputs: {input name: node id}, config}; without
one, the DAG is data_prep -> sft -> grpo -> evaluate built from the recipe's sections, with the
same stage identities (and so the same directories) as before pipelines existed.

`build_dag` refuses, before any compute, a graph with a duplicate id, an input naming no node,
a missing or unknown input, a cycle, or an edge that hands a stage the wrong contract, naming
the edge: `grpo2.policy <- eval1: expected a checkpoint, got an eval report`. Each kind's ports
and output come from its registration (stages/registry.py), which imports no stage code:
validating a recipe stays cheap.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from schemas.recipe import (
    DataPrepNode,
    EvaluateNode,
    GRPONode,
    PickNode,
    Recipe,
    RegisteredNode,
    SFTNode,
    StageNode,
)
from stages import registry
from stages.core.errors import InputError
from stages.registry import ARTIFACT_KIND_PHRASES, Port


class DagError(InputError):
    """A pipeline that cannot run; the message names the node or edge at fault."""


@dataclass(frozen=True)
class Dag:
    """Validated nodes in a topological order (the recipe's order where it is free)."""

    nodes: tuple[StageNode, ...]

    def node(self, node_id: str) -> StageNode:
        return next(n for n in self.nodes if n.id == node_id)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.nodes)

    def upstream(self, node_id: str) -> list[str]:
        return sorted(set(self.node(node_id).inputs.values()))

    def edges(self) -> list[tuple[str, str, str]]:
        """(upstream id, downstream id, input name) for every edge."""
        return [(src, n.id, name) for n in self.nodes for name, src in sorted(n.inputs.items())]


def default_nodes(recipe: Recipe) -> list[StageNode]:
    """data_prep -> sft -> grpo -> evaluate, from the recipe's sections (the original flow).

    The one place in pipeline/ that spells out kinds: this DAG is FAR's original flow, read
    from the recipe's top-level sections (`data`, `sft`, `grpo`, `eval`, each typed in the
    schema), and its node ids name the stage directories of every run written without a
    `pipeline:` (tests/unit/test_stage_hash_pins.py), so they cannot come from the registry.
    `eval.models` names the checkpoints to compare by these ids."""
    checkpoints = {m: m for m in ("sft", "grpo") if m in recipe.eval.models}
    return [
        DataPrepNode(id="data_prep", kind="data_prep", config=recipe.data),
        SFTNode(id="sft", kind="sft", inputs={"dataset": "data_prep"}, config=recipe.sft),
        GRPONode(
            id="grpo",
            kind="grpo",
            inputs={"dataset": "data_prep", "policy": "sft"},
            config=recipe.grpo,
        ),
        EvaluateNode(
            id="evaluate",
            kind="evaluate",
            inputs={"dataset": "data_prep", **checkpoints},
            config=recipe.eval,
        ),
    ]


def build_dag(recipe: Recipe) -> Dag:
    """The recipe's pipeline (or the default one), validated; raises DagError naming the fault."""
    nodes = list(recipe.pipeline) if recipe.pipeline is not None else default_nodes(recipe)
    by_id: dict[str, StageNode] = {}
    for node in nodes:
        if node.id in by_id:
            raise DagError(f"node id {node.id!r} is used twice; ids must be unique")
        by_id[node.id] = node
    for node in nodes:
        _spec(node)
        node_config(recipe, node)  # a registered kind's config, against its config model
    for node in nodes:
        _check_inputs(node, by_id, recipe)
    for node in nodes:
        for name, port in _ports(node, recipe).items():
            if port.trains_on_scored and name in node.inputs:
                _check_held_out(node, name, by_id[node.inputs[name]], recipe)
    return Dag(tuple(_topological(nodes)))


def node_order(recipe: Recipe) -> tuple[str, ...]:
    """The node ids in build_dag's order, from the recipe's graph alone: no kind's
    registration is read, so a run's node of a kind this process never registered (a plugin
    not imported) keeps its place. For reading a stored run (status, audit, lineage), never
    for deciding whether a recipe can run (build_dag). An input naming no node is passed over
    (the run's records, not this order, are what an audit checks)."""
    nodes = list(recipe.pipeline) if recipe.pipeline is not None else default_nodes(recipe)
    ids = {n.id for n in nodes}
    known = [
        n.model_copy(update={"inputs": {k: v for k, v in n.inputs.items() if v in ids}})
        for n in nodes
    ]
    return tuple(n.id for n in _topological(known))


def evaluated_split(recipe: Recipe, node: StageNode) -> str:
    """The dataset split an evaluation node scores: the one its `dataset` port reads (an
    evaluate node's config's `split`, else the recipe's eval's)."""
    port = _ports(node, recipe).get("dataset")
    if port is None or port.split_field is None:
        raise DagError(f"{node.id} is a {node.kind} node, which scores no split of a dataset")
    (split,) = port.splits
    return split


def _spec(node: StageNode) -> registry.StageSpec:
    """The node's registration; a kind nothing registers is a DagError naming the node."""
    try:
        return registry.spec(node.kind)
    except registry.UnknownStageKind as e:
        raise DagError(f"{node.id}: {e}") from e


def _ports(node: StageNode, recipe: Recipe) -> dict[str, Port]:
    """The node's inputs; a port whose split a config field names (an evaluate node's
    dataset) must hold the split the node's config names."""
    ports = dict(_spec(node).ports)
    for name, port in ports.items():
        if port.split_field is not None:
            split = getattr(node_config(recipe, node), port.split_field)
            ports[name] = dataclasses.replace(port, splits=frozenset({split}))
    return ports


def _check_held_out(node: StageNode, name: str, evaluation: StageNode, recipe: Recipe) -> None:
    """A node that trains on what an evaluation scored (hard_subset) never trains on the
    held-out eval split."""
    if evaluated_split(recipe, evaluation) == "eval":
        raise DagError(
            f"{node.id}.{name} <- {evaluation.id}: {evaluation.id} scores the held-out "
            f"eval split, and training on its hard prompts would leak them into every later "
            f"evaluation; give {node.kind} an evaluate node with config split: grpo_train"
        )
    source = node.inputs["dataset"]
    if evaluation.inputs.get("dataset") != source:
        raise DagError(
            f"{node.id}.dataset <- {source}: must be the dataset {evaluation.id} evaluated "
            f"({evaluation.inputs.get('dataset')}), whose prompt ids it scored"
        )


def _check_inputs(node: StageNode, by_id: dict[str, StageNode], recipe: Recipe) -> None:
    ports = _ports(node, recipe)
    for name, port in ports.items():
        if port.required and name not in node.inputs:
            raise DagError(
                f"{node.id} ({node.kind}) needs an input {name!r} ({_wants(port)}); "
                f"it has {sorted(node.inputs) or 'none'}"
            )
    for name, source in node.inputs.items():
        edge = f"{node.id}.{name} <- {source}"
        given = ports.get(name, _spec(node).any_other_input)
        if given is None:
            raise DagError(f"{edge}: {node.kind} has no input {name!r}; inputs: {sorted(ports)}")
        if source not in by_id:
            raise DagError(f"{edge}: no node {source!r}; nodes: {sorted(by_id)}")
        _check_edge(edge, given, by_id[source], recipe)
    if isinstance(node, PickNode):
        _check_pick(node, by_id, recipe)
    if node.kind == "hard_subset" and node_config(recipe, node).gold_sft:
        _check_gold(node, by_id, recipe)
    if isinstance(node, EvaluateNode) and node.config is not None:
        for model in node.config.models:
            if model != "base" and "/" not in model and model not in node.inputs:
                raise DagError(
                    f"{node.id}: eval model {model!r} is neither 'base', a checkpoint URI, "
                    f"nor an input of this node; inputs: {sorted(node.inputs)}"
                )


def _produced_splits(source: StageNode, recipe: Recipe) -> frozenset[str]:
    """The splits a dataset node's output holds: its registration's, less a data_prep's
    validation split when its config draws none."""
    splits = _spec(source).splits
    if isinstance(source, DataPrepNode) and node_config(recipe, source).validation is None:
        return splits - {"validation"}
    if source.kind == "hard_subset" and node_config(recipe, source).gold_sft:
        return splits | {"sft_train"}
    return splits


def _check_gold(node: StageNode, by_id: dict[str, StageNode], recipe: Recipe) -> None:
    """A hard_subset with gold_sft reads the gold targets a data_prep with gold_targets
    writes: refused here, not after the evaluation it selects by."""
    source = by_id[node.inputs["dataset"]]
    if not (isinstance(source, DataPrepNode) and node_config(recipe, source).gold_targets):
        raise DagError(
            f"{node.id}.dataset <- {source.id}: gold_sft writes the kept prompts' gold targets, "
            f"which only a data_prep node with data.gold_targets: true keeps"
        )


def _check_pick(node: StageNode, by_id: dict[str, StageNode], recipe: Recipe) -> None:
    """A pick node chooses between its candidate inputs by an evaluation of the validation
    split that scored the very same nodes under the same names."""
    missing = [name for name in node.config.candidates if name not in node.inputs]
    if missing:
        raise DagError(
            f"{node.id}: candidates {missing} are not inputs of this node; inputs: "
            f"{sorted(node.inputs)}"
        )
    evaluation = by_id[node.inputs["evaluation"]]
    split = evaluated_split(recipe, evaluation)
    if split != "validation":
        raise DagError(
            f"{node.id}.evaluation <- {evaluation.id}: it scores the {split!r} split; pick "
            f"chooses on the validation split (set config split: validation, and "
            f"data.validation), so the held-out eval split is scored after the choice"
        )
    for name in node.config.candidates:
        if evaluation.inputs.get(name) != node.inputs[name]:
            raise DagError(
                f"{node.id}.{name} <- {node.inputs[name]}: {evaluation.id} must evaluate the "
                f"same node under the same name (it has {name!r} <- "
                f"{evaluation.inputs.get(name)})"
            )


def _check_edge(edge: str, port: Port, source: StageNode, recipe: Recipe) -> None:
    produced = _spec(source).produces
    if produced not in port.accepts:
        raise DagError(f"{edge}: expected {_wants(port)}, got {ARTIFACT_KIND_PHRASES[produced]}")
    if port.producers and source.kind not in port.producers:
        raise DagError(
            f"{edge}: expected the output of a {' or '.join(port.producers)} node, "
            f"got a {source.kind} node's"
        )
    held_splits = _produced_splits(source, recipe)
    missing = port.splits - held_splits
    if produced == "dataset" and missing:
        held = ", ".join(sorted(held_splits))
        hint = (
            "; set data.validation"
            if "validation" in missing and source.kind == "data_prep"
            else ""
        )
        raise DagError(
            f"{edge}: expected a dataset with split {', '.join(sorted(missing))}, "
            f"got a {source.kind} dataset ({held}){hint}"
        )


def _wants(port: Port) -> str:
    what = " or ".join(ARTIFACT_KIND_PHRASES[k] for k in port.accepts)
    return f"{what} with split {', '.join(sorted(port.splits))}" if port.splits else what


def _topological(nodes: list[StageNode]) -> list[StageNode]:
    """Kahn's algorithm, taking ready nodes in recipe order; a cycle is named by its nodes."""
    done: set[str] = set()
    ordered: list[StageNode] = []
    pending = list(nodes)
    while pending:
        ready = [n for n in pending if set(n.inputs.values()) <= done]
        if not ready:
            raise DagError(f"the pipeline has a cycle through {_cycle(pending)}")
        ordered.append(ready[0])
        done.add(ready[0].id)
        pending.remove(ready[0])
    return ordered


def _cycle(pending: list[StageNode]) -> str:
    """One cycle among nodes that can never become ready, as 'a -> b -> a'."""
    by_id = {n.id: n for n in pending}
    path: list[str] = [pending[0].id]
    while True:
        following = next(s for s in sorted(set(by_id[path[-1]].inputs.values())) if s in by_id)
        if following in path:
            loop = [*path[path.index(following) :], following]
            return " -> ".join(reversed(loop))
        path.append(following)


def node_config(recipe: Recipe, node: StageNode) -> Any:
    """A node's config: its own, or the recipe's section for its kind.

    An evaluate node without its own config takes the recipe's `eval` with models 'base' and
    the node's checkpoint inputs.
    """
    if isinstance(node, RegisteredNode):
        return _registered_config(recipe, node)
    if node.config is not None:
        return node.config
    if isinstance(node, EvaluateNode):
        models = ["base", *sorted(n for n in node.inputs if n != "dataset")]
        return recipe.eval.model_copy(update={"models": models})
    section = _spec(node).section
    if section is None:
        raise DagError(f"{node.id} ({node.kind}) has no config and its kind reads no section")
    return getattr(recipe, section)


def _registered_config(recipe: Recipe, node: RegisteredNode) -> Any:
    """A RegisteredNode's config, validated against its kind's config model (the schema keeps
    it a mapping: schemas/ cannot read the registry); DagError names the node and the field."""
    spec = _spec(node)
    if node.config is None and spec.section is not None:
        return getattr(recipe, spec.section)
    try:
        return spec.config.model_validate(node.config or {})
    except ValidationError as e:
        problems = "; ".join(
            f"config.{'.'.join(str(p) for p in item['loc'])}: {item['msg']} "
            f"(got {item.get('input')!r})"
            for item in e.errors()
        )
        raise DagError(
            f"{node.id} ({node.kind}): {problems}; expected a {spec.config.__name__}"
        ) from e
