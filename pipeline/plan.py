"""What `far run` and the scheduled deployment share: turning a recipe URI plus overrides into
a validated run plan (recipe, normalized storage root, session deadline).

Both entry points go through `plan_run`, so a recipe that `far run` accepts is accepted by the
deployment with the same overrides, and the deadline is counted from the same moment (once the
recipe is valid, before any stage starts). No Prefect and no JAX here: it stays cheap to import.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from pipeline import manifest
from pipeline.dag import build_dag, node_config
from pipeline.nodes import Artifact, run_node
from pipeline.recipes import load_recipe
from schemas.recipe import DataPrepConfig, EvalConfig, Recipe, SourceSpec, StageNode
from schemas.record import ArtifactRef, RunSummary, StageRecord, StageSummary
from stages import registry, rewards
from stages.core import drift, ledger, metrics_logging, storage
from stages.core.errors import InputError, TamperedStage
from stages.core.identity import REWARD_SOURCE, SOURCE_PREFIX
from stages.core.records import (
    IDENTITY_NAME,
    RECORD_NAME,
    find_record,
    located_output,
    read_record,
    verify_before_reuse,
)
from stages.core.runner import RunContext, StageWouldRun
from stages.core.shared import SharedBuilds


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
    and evaluation at the recipe's isolation level (every run evaluates, so every run needs it),
    and metrics_logging.MissingBackendPackage when the recipe's logging: turns on W&B or MLflow
    without its package.
    """
    rewards.require_isolation(recipe.sandbox.isolation)
    metrics_logging.require_packages(recipe.logging)  # W&B or MLflow on but not installed
    budget = recipe.session_budget
    deadline = time.time() + budget.total_seconds() if budget is not None else None
    return RunPlan(recipe, storage.normalize(recipe.storage_root), deadline)


@dataclass(frozen=True)
class NodePlan:
    """What `far run` would do with one node of the DAG, read from the run's storage."""

    node: str
    kind: str
    # run | continue | skip | refused | depends (on an upstream node that runs first: skip
    # if that node's new output is the one this node's directory used, else run) | - (not
    # reached after a refused stage)
    action: str
    stage_hash: str | None  # the directory's hash (first 12 hex digits); None: not known yet
    detail: str
    models: list[str] | None = None  # an evaluate node: the models it scores (with_models)


def with_models(recipe: Recipe, plans: list[NodePlan]) -> list[NodePlan]:
    """The plans with each evaluate node's models (its config's, as the run builds it)."""
    nodes = {node.id: node for node in build_dag(recipe).nodes}
    shown = []
    for plan in plans:
        config = node_config(recipe, nodes[plan.node]) if plan.node in nodes else None
        models = list(config.models) if isinstance(config, EvalConfig) else None
        shown.append(dataclasses.replace(plan, models=models))
    return shown


@storage.reads_once()  # a plan writes nothing: each file, each listing read once
def preview(
    recipe: Recipe, root: str, allow_changes: Sequence[str] = (), cache_dir: str | None = None
) -> tuple[list[NodePlan], str | None]:
    """Each node of the recipe's DAG in the order it runs, with what a run would do with it,
    decided by the run's own code: the recipe's drift from run.json (manifest.recipe_drift,
    as `open_session` checks it), then each node through its stage's entry point in plan mode
    (RunContext.plan_only), where `run_stage` makes the run's decision (stages.core.decisions.
    decide: the record's seal and files verified, the drift guard against the node's previous
    directory) and hands it back instead of working. A node is decided once every input is
    known, i.e. its upstream nodes are skipped; one after a node that runs first shows
    `run` (no directory yet) or `depends`. Computes nothing and writes nothing.

    Returns the node plans and, when the run would be refused, why (one line).
    """
    dag = build_dag(recipe)
    run_uri = storage.join(root, recipe.name)
    if not storage.exists(manifest.manifest_uri(run_uri)):
        return [NodePlan(n.id, n.kind, "run", None, "new run") for n in dag.nodes], None
    try:
        manifest.recipe_drift(recipe, manifest.read_manifest(run_uri), allow_changes)
    except drift.DriftError as e:
        refused = [
            NodePlan(n.id, n.kind, "refused", None, _touched(e.changes, n, recipe))
            for n in dag.nodes
        ]
        return refused, _says(e.refused)
    ctx = RunContext(
        root=root,
        run=recipe.name,
        cache_dir=cache_dir,
        allow_changes=tuple(allow_changes),
        sandbox_isolation=recipe.sandbox.isolation,
        sandbox_workers=recipe.sandbox.workers,
        reward_call_seconds=recipe.sandbox.reward_call_seconds,
        shared=SharedBuilds(),
        plan_only=True,
    )
    states = {s.stage: s for s in manifest.run_status(run_uri) if s.state != "superseded"}
    outputs: dict[str, Artifact] = {}
    plans: list[NodePlan] = []
    refusal: str | None = None
    for node in dag.nodes:
        if refusal is not None:
            plans.append(NodePlan(node.id, node.kind, "-", None, "not reached"))
            continue
        waiting = [up for up in dag.upstream(node.id) if up not in outputs]
        if waiting:
            plan, refusal = _after(node, waiting, states.get(node.id), allow_changes)
        else:
            plan, refusal = _decided(recipe, node, ctx, outputs)
        plans.append(plan)
    return plans, refusal


def _decided(
    recipe: Recipe, node: StageNode, ctx: RunContext, outputs: dict[str, Artifact]
) -> tuple[NodePlan, str | None]:
    """The run's decision for a node whose inputs are all known (their stages are skipped);
    a skipped node's output joins `outputs` for the nodes it feeds."""
    inputs = {name: outputs[source] for name, source in node.inputs.items()}
    try:
        outcome = run_node(recipe, node, node_config(recipe, node), inputs, ctx)
    except StageWouldRun as planned:
        decision = planned.decision
        detail = decision.detail
        if decision.action == "continue" and decision.previous is None:
            detail = _resume_detail(decision.directory)
        return NodePlan(
            node.id, node.kind, decision.action, _hash(decision.directory), detail
        ), None
    except drift.DriftError as e:
        shown = "; ".join(str(c) for c in e.changes)
        return NodePlan(node.id, node.kind, "refused", None, shown), _says(e.refused)
    except InputError as e:  # a tampered stage, a missing input: the run ends here too
        line = " ".join(str(e).split())
        return NodePlan(node.id, node.kind, "refused", None, line), line
    outputs[node.id] = outcome.output
    directory = outcome.record_uri.rsplit("/", 1)[0]
    return NodePlan(node.id, node.kind, "skip", _hash(directory), "complete"), None


def _after(
    node: StageNode,
    waiting: list[str],
    state: manifest.StageState | None,
    allow_changes: Sequence[str],
) -> tuple[NodePlan, str | None]:
    """A node after `waiting` nodes that run first: its inputs are not known yet. A new stage
    code version is refused whatever they produce (its identity holds the version)."""
    after = ", ".join(waiting)
    code = _code_change(node.kind, state)
    if code is not None and not drift.is_allowed(code, allow_changes):
        why = f"{code} (refused when it starts, after {after} ran)"
        return NodePlan(node.id, node.kind, "refused", None, why), _says([code])
    if state is None or state.directory is None:
        return NodePlan(node.id, node.kind, "run", None, f"after {after}"), None
    used = state.directory.rsplit("/", 1)[-1]
    why = f"on {after}: skip if its new output is the one {used} used, else run"
    return NodePlan(node.id, node.kind, "depends", None, why), None


def _resume_detail(directory: str) -> str:
    """How a started, uncommitted directory continues: from its latest checkpoint step."""
    step = manifest.latest_checkpoint_step(directory)
    max_steps = manifest.max_steps_of(directory)
    if max_steps is None:
        return "started before, not committed: runs again in its directory"
    if step is not None and step >= max_steps:
        return f"at step {step}/{max_steps}: no step left, commits it again"
    return f"from step {step or 0}/{max_steps}"


def _hash(directory: str) -> str:
    return directory.rsplit("-", 1)[-1]


def _touched(changes: list[drift.Change], node: StageNode, recipe: Recipe) -> str:
    touching = [str(c) for c in changes if _touches(c.path, node, recipe)]
    return "; ".join(touching) or "the session as a whole is refused"


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


@dataclass(frozen=True)
class CompletedNode:
    """One node of a complete run, as its committed record shows it."""

    node: str
    kind: str
    record_uri: str
    output_uri: str

    @property
    def stage_hash(self) -> str:
        return _hash(self.record_uri.rsplit("/", 1)[0])


@storage.reads_once()  # writes nothing: each file, each listing read once
def completed_nodes(
    recipe: Recipe,
    root: str,
    allow_changes: Sequence[str] = (),
    key: SecretStr | None = None,
    changed_code: list[tuple[str, drift.Change]] | None = None,
) -> list[CompletedNode] | None:
    """Every node of the recipe's DAG, when the run is complete and a run would skip them all,
    shown from storage alone (no stage module, so no JAX): `far run` on a finished run and
    `far validate` answer from it in a second. None whenever any part is not shown, and the
    run's own path (each stage's entry point) decides as before.

    Complete means: run.json holds this very recipe (no change at all, allowed or not) and its
    last session ended complete; the ledger's chain is unbroken (signed, with `key`) and every
    record and run.json match their latest entries; and each node's current directory holds
    a committed record that `run_stage` would reuse: sealed, its files unaltered, the stage
    code version and hashed config the node has now, built on its upstream nodes' current
    outputs (read through the records that hold them, unchanged since it read them: a pick
    node's output is its chosen stage's checkpoint, under that stage's record), and its
    external sources (data files, packages) and a user's rewards' source files with the
    fingerprints it recorded.

    Each node whose user reward's code changed since its record is added to `changed_code`
    (when given) with the change, as the node's drift guard names it, so the run can say why
    it is not complete before any session starts.
    """
    run_uri = storage.join(root, recipe.name)
    if not storage.exists(manifest.manifest_uri(run_uri)):
        return None
    run_manifest = manifest.read_manifest(run_uri)
    try:
        if manifest.recipe_drift(recipe, run_manifest, allow_changes):
            return None
    except drift.DriftError:
        return None
    last = run_manifest.invocations[-1] if run_manifest.invocations else None
    if last is None or last.outcome != "complete":
        return None
    states = {s.stage: s for s in manifest.run_status(run_uri) if s.state != "superseded"}
    dag = build_dag(recipe)
    directories = {n.id: states[n.id].directory for n in dag.nodes if n.id in states}
    complete = all(states[n].state == "complete" for n in directories)
    if not complete or len(directories) < len(dag.nodes) or None in directories.values():
        return None  # before any file is hashed: a run that continues reads them itself
    found: dict[str, CompletedNode] = {}
    holders: dict[str, str] = {}  # node -> the record its output lies under, as stages read it
    for node in dag.nodes:
        record_uri = storage.join(str(directories[node.id]), RECORD_NAME)
        record = read_record(record_uri)
        upstream = [holders[up] for up in dag.upstream(node.id)]
        if record is not None and changed_code is not None:
            changed_code += [(node.id, c) for c in reward_changes(record)]
        if record is None or not _reusable(recipe, node, run_uri, record_uri, record, upstream):
            return None
        output = located_output(record_uri, record).uri
        found[node.id] = CompletedNode(node.id, node.kind, record_uri, output)
        holder = find_record(output, levels=3)  # a pick's output is its chosen stage's
        if holder is None:
            return None
        holders[node.id] = holder[0]
    return list(found.values()) if _ledger_holds(run_uri, found.values(), key) else None


def completed_run_summary(
    recipe: Recipe, root: str, done: list[CompletedNode], seconds: float
) -> RunSummary:
    """The summary of a complete run from its records (`completed_nodes`): every stage skipped, and
    the ledger root as it stands, since nothing was written."""
    run_uri = storage.join(root, recipe.name)
    stages = [
        StageSummary(
            stage=n.node, output_uri=n.output_uri, record_uri=n.record_uri, skipped=True, seconds=0
        )
        for n in done
    ]
    return RunSummary(
        run=recipe.name,
        run_uri=run_uri,
        complete=True,
        stages=stages,
        seconds=seconds,
        ledger_root=ledger.root(run_uri),
    )


def check_changed_code(
    changed: list[tuple[str, drift.Change]], allow_changes: Sequence[str]
) -> list[str]:
    """A user's reward whose source file changed since a complete stage used it (`completed_nodes`'s
    `changed_code`): drift.DriftError before any session starts, as the stage's own drift
    guard refuses it; when allowed, a line saying so for each stage."""
    lines = []
    for node in dict.fromkeys(n for n, _ in changed):
        changes = [c for n, c in changed if n == node]
        drift.check(f"stage {node}", changes, allow_changes)
        shown = "; ".join(str(c) for c in changes)
        lines.append(f"not complete: the reward code of stage {node} changed ({shown}), allowed")
    return lines


def _reusable(
    recipe: Recipe,
    node: StageNode,
    run_uri: str,
    record_uri: str,
    record: StageRecord,
    upstream: list[str],
) -> bool:
    """Whether `run_stage` would skip `node` on this record (see `completed_nodes`)."""
    try:
        verify_before_reuse(record_uri, record)
    except TamperedStage:
        return False  # the run's own path refuses it, naming what differs
    config = node_config(recipe, node)
    if (
        record.stage != node.kind
        or (record.node or record.stage) != node.id
        or record.code.stage_version != stage_version(node.kind)
        or registry.hashed_config(node.kind, config) not in record.config.values()
        or set(record.inputs) != set(record.input_artifacts)
    ):
        return False
    read = {_in_run(run_uri, ref.record_uri) for ref in record.input_artifacts.values()}
    if not set(upstream) <= read:
        return False
    return all(
        _unchanged_input(run_uri, name, ref, config) for name, ref in record.input_artifacts.items()
    )


def _in_run(run_uri: str, uri: str | None) -> str | None:
    if uri is None or "://" in uri or uri.startswith("/"):
        return uri
    return storage.join(run_uri, uri)


def _unchanged_input(run_uri: str, name: str, ref: ArtifactRef, config: object) -> bool:
    """An upstream record as the stage read it (same bytes), or an external source of a
    data_prep node with the fingerprint it had; any other input is not shown here."""
    uri = _in_run(run_uri, ref.record_uri)
    if uri is not None:
        if ref.record_digest is None or not storage.exists(uri):
            return False
        return storage.sha256_bytes(storage.read_bytes(uri)) == ref.record_digest
    if name.startswith(SOURCE_PREFIX + REWARD_SOURCE):
        return reward_change(name, ref) is None
    if not (isinstance(config, DataPrepConfig) and name.startswith(SOURCE_PREFIX)):
        return False
    from stages.data_prep.fingerprints import source_fingerprint  # reads no model, imports no JAX

    kind, _, source = name.removeprefix(SOURCE_PREFIX).partition(":")
    specs = [s for s in _sources(config) if s.kind == kind and s.name == source]
    return bool(specs) and all(source_fingerprint(s) == ref.fingerprint for s in specs)


def reward_changes(record: StageRecord) -> list[drift.Change]:
    """Each user reward a stage recorded whose code differs from the reward registered now."""
    changes = [reward_change(k, ref) for k, ref in record.input_artifacts.items()]
    return [c for c in changes if c is not None]


def reward_change(name: str, ref: ArtifactRef) -> drift.Change | None:
    """A user's reward recorded as input `name` ("source:reward:NAME:MODULE", fingerprint: the
    sha256 of the module's source file) against the reward as this process registered it (its
    plugin module, imported to read the recipe, hashed its file then), as the stage's drift
    guard names it (`code.rewards.NAME`); None when it is the same code, or `name` is no reward.
    """
    if not name.startswith(SOURCE_PREFIX + REWARD_SOURCE):
        return None
    reward, _, module = name.removeprefix(SOURCE_PREFIX + REWARD_SOURCE).partition(":")
    found = rewards.REGISTRY.get(reward)
    if found is not None and found.module == module and found.digest == ref.fingerprint:
        return None
    return drift.Change(
        f"code.rewards.{reward}", ref.fingerprint, None if found is None else found.digest
    )


def _sources(config: DataPrepConfig) -> list[SourceSpec]:
    splits = [config.eval, config.grpo, config.sft, config.validation]
    return [source for split in splits if split is not None for source in split.sources]


def _ledger_holds(run_uri: str, nodes: Iterable[CompletedNode], key: SecretStr | None) -> bool:
    """The run's ledger chain is whole (signed, with `key`) and every record and run.json
    match their latest entries, as `far audit` checks them."""
    entries, unreadable = ledger.scan(run_uri)
    present = {ledger.relative(run_uri, n.record_uri) for n in nodes}
    problems = [
        *unreadable,
        *ledger.verify(run_uri, entries, key),
        *ledger.check_files(run_uri, entries, present),
    ]
    return not problems


def render_preview(plans: list[NodePlan]) -> str:
    """The plan as aligned lines: node, kind, stage hash, action, why."""
    lines = []
    for p in plans:
        digest = p.stage_hash or "-"
        scores = f" (scores {', '.join(p.models)})" if p.models else ""
        lines.append(f"  {p.node:<14} {p.kind:<12} {digest:<13} {p.action:<9} {p.detail}{scores}")
    return "\n".join(lines)
