"""What `far run` and the scheduled deployment share: turning a recipe URI plus overrides into
a validated run plan (recipe, normalized storage root, session deadline).

Both entry points go through `plan_run`, so a recipe that `far run` accepts is accepted by the
deployment with the same overrides, and the deadline is counted from the same moment (once the
recipe is valid, before any stage starts). No Prefect and no JAX here: it stays cheap to import.
"""

from __future__ import annotations

import ast
import importlib.util
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline import manifest
from pipeline.dag import build_dag
from pipeline.recipes import load_recipe
from schemas.recipe import Recipe, StageNode
from stages import registry, rewards
from stages.core import drift, storage
from stages.core.runner import IDENTITY_NAME


@dataclass(frozen=True)
class RunPlan:
    recipe: Recipe
    root: str  # the recipe's storage_root, normalized (absolute path or URI)
    deadline: float | None  # epoch seconds when the session budget runs out; None: no budget


def plan_run(
    recipe_uri: str,
    storage_root: str | None = None,
    name: str | None = None,
    session_budget: str | None = None,
    assignments: Sequence[str] = (),
) -> RunPlan:
    """Load and validate `recipe_uri` with overrides (None keeps the recipe's value) and
    dotted-path `assignments` (`sft.max_steps=20`), validated by the same schema.

    Raises pipeline.recipes.RecipeError naming every bad field.
    """
    overrides = {"storage_root": storage_root, "name": name, "session_budget": session_budget}
    return plan_recipe(load_recipe(recipe_uri, overrides, assignments))


def plan_recipe(recipe: Recipe) -> RunPlan:
    """The plan for an already validated recipe (e.g. the one stored in a run's run.json).

    Raises rewards.IsolationUnavailable when this machine cannot sandbox the run's rewards
    and evaluation at the recipe's isolation level (every run evaluates, so every run needs it).
    """
    rewards.require_isolation(recipe.sandbox.isolation)
    budget = recipe.session_budget
    deadline = time.time() + budget.total_seconds() if budget is not None else None
    return RunPlan(recipe, storage.normalize(recipe.storage_root), deadline)


@dataclass(frozen=True)
class NodePlan:
    """What `far run` would do with one node of the DAG, read from the run's storage."""

    node: str
    kind: str
    action: str  # run | continue | skip | refused | - (not reached after a refused stage)
    stage_hash: str | None  # the directory's hash (first 12 hex digits); None: not known yet
    detail: str


def preview(
    recipe: Recipe, root: str, allow_changes: Sequence[str] = ()
) -> tuple[list[NodePlan], str | None]:
    """Each node of the recipe's DAG in the order it runs, with what a run would do with it:
    skip (complete on storage), continue (a partial directory), run, or refused by the drift
    guard (the recipe differs from the run's run.json in a way not allowed). Reads records
    only; computes nothing. A stage hash is known once its directory exists: a new stage's
    hash depends on its inputs' fingerprints, which exist only once its upstream stages ran.

    Returns the node plans and, when the drift guard would refuse the session, why.
    """
    dag = build_dag(recipe)
    run_uri = storage.join(root, recipe.name)
    if not storage.exists(manifest.manifest_uri(run_uri)):
        return [NodePlan(n.id, n.kind, "run", None, "new run") for n in dag.nodes], None
    old = manifest.with_current_defaults(manifest.read_manifest(run_uri).recipe)
    changes = drift.recipe_changes(old, recipe.model_dump(mode="json"))
    refused = [c for c in changes if not drift.is_allowed(c, allow_changes)]
    states = {s.stage: s for s in manifest.run_status(run_uri) if s.state != "superseded"}
    plans: dict[str, NodePlan] = {}
    stopped_at: list[drift.Change] = []  # a stage refused when it starts: the flow ends there
    for node in dag.nodes:
        state = states.get(node.id)
        digest = state.directory.rsplit("-", 1)[-1] if state and state.directory else None
        touching = [c for c in changes if _touches(c.path, node, recipe)]
        code = _code_change(node.kind, state)
        touching += [code] if code is not None else []
        touched = "; ".join(str(c) for c in touching)
        if refused:
            why = touched or "the session as a whole is refused"
            plans[node.id] = NodePlan(node.id, node.kind, "refused", digest, why)
        elif stopped_at:
            plans[node.id] = NodePlan(node.id, node.kind, "-", None, "not reached")
        elif code is not None and not drift.is_allowed(code, allow_changes):
            stopped_at.append(code)
            plans[node.id] = NodePlan(node.id, node.kind, "refused", digest, touched)
        elif touching and drift.continuable(touching) and state and state.step:
            why = f"from step {state.step} in a new directory ({touched})"
            plans[node.id] = NodePlan(node.id, node.kind, "continue", None, why)
        elif touching:
            plans[node.id] = NodePlan(node.id, node.kind, "run", None, touched)
        elif any(plans[up].action != "skip" for up in dag.upstream(node.id)):
            plans[node.id] = NodePlan(node.id, node.kind, "run", None, "an input changes")
        elif state is None or state.state == "not started":
            plans[node.id] = NodePlan(node.id, node.kind, "run", None, "not started")
        elif state.state == "complete":
            plans[node.id] = NodePlan(node.id, node.kind, "skip", digest, "complete")
        else:
            step = f"step {state.step or 0}/{state.max_steps}" if state.max_steps else "partial"
            plans[node.id] = NodePlan(node.id, node.kind, "continue", digest, f"from {step}")
    refusal = refused or stopped_at
    return [plans[n.id] for n in dag.nodes], _says(refusal) if refusal else None


def stage_version(kind: str) -> int | None:
    """A stage kind's STAGE_VERSION, read from the source of its registered entry point's
    module without importing it (a stage imports JAX and Tunix, seconds that a plan does not
    need); None if not found."""
    if kind not in registry.REGISTRY:
        return None
    spec = importlib.util.find_spec(registry.spec(kind).module)
    if spec is None or spec.origin is None:
        return None
    for statement in ast.parse(Path(spec.origin).read_text()).body:
        if (
            isinstance(statement, ast.Assign)
            and [getattr(t, "id", None) for t in statement.targets] == ["STAGE_VERSION"]
            and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, int)
        ):
            return statement.value.value
    return None


def _code_change(kind: str, state: manifest.StageState | None) -> drift.Change | None:
    """The stage's code version against the one its directory was started with (drift)."""
    if state is None or state.directory is None:
        return None
    started = storage.read_json(storage.join(state.directory, IDENTITY_NAME)).get("version")
    current = stage_version(kind)
    if started is None or current is None or started == current:
        return None
    return drift.Change(f"code.{kind}_version", started, current)


def _touches(path: str, node: StageNode, recipe: Recipe) -> bool:
    """Whether a changed recipe path feeds `node`: the model feeds every node, a pipeline
    node's own entry (`pipeline.<id>...`) only that node (drift.diff compares nodes by id)."""
    parts = path.split(".")
    head = parts[0]
    if head == "pipeline" and len(parts) > 1:
        return parts[1] == node.id
    if head in ("model", "pipeline"):
        return True
    uses_section = recipe.pipeline is None or node.config is None
    return uses_section and registry.spec(node.kind).section == head


def _says(refused: list[drift.Change]) -> str:
    shown = "; ".join(str(c) for c in refused)
    flags = " ".join(f"--allow-change {c.path}" for c in refused)
    return f"refused by the drift guard: {shown} (start a new run with --name, or {flags})"


def render_preview(plans: list[NodePlan]) -> str:
    """The plan as aligned lines: node, kind, stage hash, action, why."""
    lines = []
    for p in plans:
        digest = p.stage_hash or "-"
        lines.append(f"  {p.node:<14} {p.kind:<12} {digest:<13} {p.action:<9} {p.detail}")
    return "\n".join(lines)
