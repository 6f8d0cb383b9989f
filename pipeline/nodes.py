"""Running one node of a pipeline: its stage's entry point, fed its inputs' artifacts.

The flow (flows/far_flow.py) calls `run_node` once per node, in the DAG's order, with the
outputs of the node's upstream nodes keyed by input name. Each stage decides from its records
on storage whether it runs or is skipped; this module only finds the node's registration
(stages/registry.py) and calls its entry point in the one shape every stage has,
`run(inputs, config, ctx)`. The node id, the recipe's model, its mesh and its logging go into
the RunContext, so a stage's directory is {node id}-{hash}.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from schemas.artifacts import Artifact
from schemas.recipe import Recipe, StageNode
from stages import registry
from stages.core.runner import RunContext, StageOutcome

__all__ = ["Artifact", "run_node"]


def run_node(
    recipe: Recipe, node: StageNode, config: Any, inputs: dict[str, Artifact], ctx: RunContext
) -> StageOutcome[Any]:
    """Run (or skip, if committed) `node` with `config` on its upstream `inputs`."""
    spec = registry.spec(node.kind)
    if not isinstance(config, spec.config):
        raise TypeError(
            f"node {node.id}: expected a {spec.config.__name__} config, got {type(config).__name__}"
        )
    ctx = dataclasses.replace(
        ctx, node=node.id, model=recipe.model, mesh=recipe.mesh, metrics_logging=recipe.logging
    )
    outcome: StageOutcome[Any] = spec.entry_point()(inputs, config, ctx)
    return outcome
