"""Running one node of a pipeline: its stage's entry point, fed its inputs' artifacts.

The flow (flows/far_flow.py) calls `run_node` once per node, in the DAG's order, with the
outputs of the node's upstream nodes keyed by input name. Each stage decides from its records
on storage whether it runs or is skipped; this module only finds the node's registration
(stages/registry.py) and calls its entry point in the one shape every stage has,
`run(inputs, config, ctx)`. The node id, the recipe's model, its mesh and its logging go into
the RunContext, so a stage's directory is {node id}-{hash}.

A run's nodes share one process, so what a node built must be gone before the next one builds
its own. A training stage leaves its trainer, optimizer state and LoRA clone in reference
cycles (Tunix's trainers and Flax NNX modules refer back to each other), which only Python's
cyclic collector frees, and it runs rarely: on the real Gemma 3 270M an SFT node left 1,744
live JAX arrays (2,087 MB) of which a collection freed 1,526 (1,064 MB), memory that otherwise
sat beside the next nodes' own until Python collected on its own (bench/node_memory.py,
docs/log.md, 2026-11-27). So `run_node` collects after every node that ran, whether it returned
or raised; not after a skipped node or a plan-mode decision, which build nothing (a collection
costs about 0.2 CPU-s in a process that has imported Tunix and Prefect, and `far validate` or a
re-run of a finished run stays quick).
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

from schemas.artifacts import Artifact
from schemas.recipe import Recipe, StageNode
from stages import registry
from stages.core.runner import RunContext, StageOutcome, StageWouldRun

__all__ = ["Artifact", "node_context", "run_node"]


def node_context(recipe: Recipe, node: StageNode, ctx: RunContext) -> RunContext:
    """The run's context for one node: its id, the recipe's model, mesh and logging."""
    return dataclasses.replace(
        ctx, node=node.id, model=recipe.model, mesh=recipe.mesh, metrics_logging=recipe.logging
    )


def run_node(
    recipe: Recipe, node: StageNode, config: Any, inputs: dict[str, Artifact], ctx: RunContext
) -> StageOutcome[Any]:
    """Run (or skip, if committed) `node` with `config` on its upstream `inputs`."""
    spec = registry.spec(node.kind)
    if not isinstance(config, spec.config):
        raise TypeError(
            f"node {node.id}: expected a {spec.config.__name__} config, got {type(config).__name__}"
        )
    try:
        outcome: StageOutcome[Any] = spec.entry_point()(
            inputs, config, node_context(recipe, node, ctx)
        )
    except StageWouldRun:  # plan mode: the node decided, built nothing
        raise
    except BaseException:
        gc.collect()  # what the node built before it failed or stopped (module docstring)
        raise
    if not outcome.skipped:  # a skipped node read its record and built nothing
        gc.collect()  # the node's trainer and models, held in cycles (module docstring)
    return outcome
