"""Running one node of a pipeline: its stage's entry point, fed its inputs' artifacts.

The flow (flows/far_flow.py) calls `run_node` once per node, in the DAG's order, with the
outputs of the node's upstream nodes keyed by input name. Each stage decides from its records
on storage whether it runs or is skipped; this module only maps a node to its stage's call.
The node id goes into the RunContext, so a stage's directory is {node id}-{hash}.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from schemas.artifacts import CheckpointArtifact, DatasetArtifact, EvalReport, PreferenceDataset
from schemas.recipe import Recipe, StageNode
from stages import (
    data_prep,
    distill,
    dpo,
    evaluate,
    grpo,
    hard_subset,
    preferences,
    self_teach,
    sft,
)
from stages.core.runner import RunContext, StageOutcome

Artifact = DatasetArtifact | CheckpointArtifact | EvalReport | PreferenceDataset


def run_node(
    recipe: Recipe, node: StageNode, config: Any, inputs: dict[str, Artifact], ctx: RunContext
) -> StageOutcome[Any]:
    """Run (or skip, if committed) `node` with `config` on its upstream `inputs`."""
    ctx = dataclasses.replace(ctx, node=node.id)
    model, mesh = recipe.model, recipe.mesh
    kind = node.kind
    if kind == "data_prep":
        return data_prep.prepare(config, model, ctx)
    if kind == "sft":
        dataset = _get(inputs, "dataset", DatasetArtifact)
        start = _get(inputs, "policy", CheckpointArtifact) if "policy" in inputs else None
        return sft.train(dataset, config, model, mesh, ctx, policy=start)
    if kind == "grpo":
        dataset = _get(inputs, "dataset", DatasetArtifact)
        policy = _get(inputs, "policy", CheckpointArtifact)
        return grpo.reinforce(dataset, policy, config, model, mesh, ctx)
    if kind == "evaluate":
        dataset = _get(inputs, "dataset", DatasetArtifact)
        checkpoints = {
            name: _get(inputs, name, CheckpointArtifact)
            for name in inputs
            if name != "dataset" and name in config.models
        }
        return evaluate.evaluate(dataset, checkpoints, config, model, mesh, ctx)
    if kind == "hard_subset":
        report = _get(inputs, "evaluation", EvalReport)
        return hard_subset.select(report, _get(inputs, "dataset", DatasetArtifact), config, ctx)
    if kind == "self_teach":
        dataset = _get(inputs, "dataset", DatasetArtifact)
        policy = _get(inputs, "policy", CheckpointArtifact)
        return self_teach.teach(dataset, policy, config, model, mesh, ctx)
    if kind == "preferences":
        samples = inputs.get("samples")
        if samples is not None and not isinstance(samples, EvalReport | CheckpointArtifact):
            raise TypeError(f"{node.id}.samples: expected an eval report or a checkpoint")
        dataset = _get(inputs, "dataset", DatasetArtifact) if "dataset" in inputs else None
        return preferences.build(samples, dataset, config, ctx)
    if kind == "dpo":
        policy = _get(inputs, "policy", CheckpointArtifact)
        pairs = _get(inputs, "preferences", PreferenceDataset)
        return dpo.optimize(policy, pairs, config, model, mesh, ctx)
    if kind == "distill":
        dataset = _get(inputs, "dataset", DatasetArtifact)
        teacher = _get(inputs, "teacher", CheckpointArtifact)
        return distill.distill(dataset, teacher, config, model, mesh, ctx)
    raise ValueError(f"node {node.id}: no stage runs kind {kind!r}")


def _get(inputs: dict[str, Artifact], name: str, expected: type[Any]) -> Any:
    """The input `name`, refusing another contract (build_dag checked; this guards callers)."""
    value = inputs.get(name)
    if not isinstance(value, expected):
        raise TypeError(
            f"input {name!r}: expected a {expected.__name__}, got {type(value).__name__}"
        )
    return value
