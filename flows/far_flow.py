"""The format_align_reinforce flow: one Prefect task per pipeline node, passing artifacts (URIs).

The recipe declares the stages as a DAG (pipeline/dag.py; by default data_prep -> sft -> grpo
-> evaluate); the flow runs its nodes in topological order, each task waiting on its upstream
tasks so the UI's run graph shows the DAG's edges.

Prefect adds the run graph, logs, retries and UI artifacts. Whether a stage runs or is
skipped is decided by the stage itself from the records on storage, so task caching is off.

A flow run is named after the run and its session (`smoke-s2`: run.json's second session) and
tagged with the recipe (`recipe:smoke`), each stage kind (`kind:sft`) and the code's git commit
(`commit:9e6d385abc12`), so the UI's filters find a run's sessions.

Retries: a stage that fails with a transient storage or network error (5xx, 429, timeouts,
dropped connections; stages.core.storage.is_transient) is retried by Prefect; a retried training
stage resumes from its latest checkpoint. Any other error fails the stage at once, and
everything already committed stays: running the same command again resumes at that stage.
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx
from prefect import flow, get_client, get_run_logger, runtime, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.states import Completed, State
from pydantic import SecretStr

from flows.progress import stage_progress
from flows.ui_artifacts import publish_ledger, publish_stage, run_label
from pipeline import lease, manifest, nodes
from pipeline.dag import build_dag, node_config
from pipeline.nodes import Artifact
from schemas.recipe import Recipe, StageNode
from schemas.record import RunSummary, StageSummary
from stages import registry
from stages.core import ledger, storage
from stages.core.provenance import git_commit
from stages.core.runner import (
    NoProgress,
    RunContext,
    SessionExpired,
    StageOutcome,
    is_primary_process,
)
from stages.core.sessions import LeaseLost, StopFlag, stop_on_sigterm
from stages.core.shared import SharedBuilds
from stages.modeling import compile_cache as compile_cache_lib

TRANSIENT_RETRIES = 2
RETRY_DELAYS = [10, 60]  # seconds before the first and second retry


def retry_if_transient(task: Any, task_run: TaskRun, state: State[Any]) -> bool:
    """Prefect retry condition: only transient storage/network errors are retried.

    Prefect passes the raised exception as the failed state's data, and logs each retry.
    """
    error = state.data
    return isinstance(error, BaseException) and storage.is_transient(error)


STAGE_TASK: dict[str, Any] = {
    "cache_policy": NO_CACHE,
    "retries": TRANSIENT_RETRIES,
    "retry_delay_seconds": RETRY_DELAYS,
    "retry_condition_fn": retry_if_transient,
}


def publish_to_ui(stage: str, publish: Callable[[], object]) -> None:
    """Create Prefect UI artifacts; an unreachable API is logged, not fatal.

    The stage's record is already committed on storage when this runs, and tasks keep
    running without the API (Prefect reports task states as events), so a Prefect server
    that went away must not fail a stage that succeeded. Any other error propagates.
    """
    try:
        publish()
    except httpx.TransportError as e:
        get_run_logger().warning(
            "%s: Prefect API unreachable, UI artifacts not published: %r", stage, e
        )


T = TypeVar("T", bound=Artifact)


def _finish(ctx: RunContext, stage: str, outcome: StageOutcome[T]) -> State[tuple[T, StageSummary]]:
    """Log and publish a stage's outcome; its task run ends Completed, or "Skipped" if skipped.

    A task that returns a State ends in that state, so a skipped stage shows as Skipped in the
    UI's task list and run graph. Calling the task then returns the State: `.result()` is the
    (output, summary) pair.
    """
    output = outcome.output
    verb = "skipped (already complete on storage)" if outcome.skipped else "ran"
    get_run_logger().info("%s %s -> %s", stage, verb, output.uri)
    if ctx.primary:  # one process (JAX process 0) creates the run's UI artifacts
        label = run_label(ctx.run, ctx.run_uri)
        publish_to_ui(stage, lambda: publish_stage(label, stage, outcome))
    summary = StageSummary(
        stage=stage,
        output_uri=output.uri,
        record_uri=outcome.record_uri,
        skipped=outcome.skipped,
        seconds=outcome.seconds,
    )
    name, message = ("Skipped", f"{stage} {verb}") if outcome.skipped else ("Completed", None)
    return Completed(data=(output, summary), name=name, message=message)


@task(name="stage", **STAGE_TASK)
def stage_task(
    recipe: Recipe, node: StageNode, config: Any, inputs: dict[str, Artifact], ctx: RunContext
) -> State[tuple[Artifact, StageSummary]]:
    """One pipeline node; the flow names each task after its node id."""
    if registry.spec(node.kind).progress:  # long stages report progress (terminal, UI)
        with stage_progress(ctx, run_label(recipe.name, ctx.run_uri), node.id) as reporting:
            outcome = nodes.run_node(recipe, node, config, inputs, reporting)
    else:
        outcome = nodes.run_node(recipe, node, config, inputs, ctx)
    return _finish(ctx, node.id, outcome)


def session_name(run: str, run_uri: str, sessions: int | None = None) -> str:
    """`{run}-{id}-s{n}`: the run's name, the short id of its URI (so runs named alike under
    two storage roots differ on one server) and this session's number, `sessions` or (before
    this session is recorded) the sessions run.json lists plus one; without the session number
    when run.json cannot be read (the session's own checks then name why)."""
    label = run_label(run, run_uri)
    if sessions is None:
        try:
            sessions = len(manifest.read_manifest(run_uri).invocations) + 1
        except (OSError, ValueError):  # no run yet is 1; an unreadable run.json is refused later
            if storage.exists(manifest.manifest_uri(run_uri)):
                return label
            sessions = 1
    return f"{label}-s{sessions}"


def flow_run_tags(recipe: Recipe, root: str, recipe_source: str = "") -> list[str]:
    """`far`; `recipe:NAME` (the recipe file's stem, else the run's name); `root:URI` (the
    storage root); `user:NAME` (who started it); `recipe-hash:SHA12` (recipe_hash);
    `kind:KIND` for each stage kind of its DAG; and `commit:SHA12` (the code's git commit,
    when known)."""
    stem = recipe_source.rstrip("/").rsplit("/", 1)[-1].removesuffix(".yaml").removesuffix(".yml")
    tags = ["far", f"recipe:{stem or recipe.name}", f"root:{root}", f"user:{_user()}"]
    tags.append(f"recipe-hash:{recipe_hash(recipe)[:12]}")
    tags += sorted({f"kind:{node.kind}" for node in build_dag(recipe).nodes})
    commit = git_commit()
    return tags + ([f"commit:{commit[:12]}"] if commit else [])


def recipe_hash(recipe: Recipe) -> str:
    """SHA-256 of the recipe as run (canonical JSON of every field, overrides applied) without
    its storage root, which has a tag of its own: one recipe run under two roots has one hash."""
    fields = recipe.model_dump(mode="json", exclude={"storage_root"})
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _user() -> str:
    """The login name of who started the run (the uid where the system has no name for it)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid-{os.getuid()}"


def _flow_run_name() -> str:
    """Prefect's flow_run_name: called with the flow run's parameters in context."""
    parameters = runtime.flow_run.parameters
    recipe: Recipe = parameters["recipe"]
    return session_name(recipe.name, storage.join(parameters["root"], recipe.name))


def _label_flow_run(recipe: Recipe, ctx: RunContext, recipe_source: str) -> None:
    """Name this flow run after the session run.json now records (a scheduled deployment's
    run too) and add the run's tags to those it has."""
    sessions = len(manifest.read_manifest(ctx.run_uri).invocations)
    name = session_name(recipe.name, ctx.run_uri, sessions)
    with get_client(sync_client=True) as client:
        flow_run_id = uuid.UUID(ctx.flow_run_id)
        current = client.read_flow_run(flow_run_id).tags
        ours = flow_run_tags(recipe, ctx.root, recipe_source)
        tags = [*current, *(t for t in ours if t not in current)]
        client.update_flow_run(flow_run_id, name=name, tags=tags)


@flow(name="format_align_reinforce", log_prints=True, flow_run_name=_flow_run_name)
def format_align_reinforce(
    recipe: Recipe,
    root: str,
    deadline: float | None = None,
    cache_dir: str | None = None,
    allow_changes: list[str] | None = None,
    recipe_source: str = "",
    lease_wait_seconds: float = lease.DEFAULT_WAIT_SECONDS,
    overrides: list[str] | None = None,
    compile_cache: str | None = None,
    audit_key: SecretStr | None = None,
) -> RunSummary:
    """The recipe's pipeline (default: data-prep -> SFT-format -> GRPO-reinforce -> evaluation).

    `root` is the normalized storage root; `deadline` (epoch seconds) stops the run cleanly
    between stages when the session is over: re-running the same command continues.
    `cache_dir` holds converted model weights (default ~/.cache/far). `allow_changes` are
    the recipe/code changes (dotted paths) accepted when continuing an existing run;
    `overrides` the command line's KEY=VALUE assignments (already applied to `recipe`), kept
    in run.json as given. `lease_wait_seconds`: how long to wait for another session holding
    the run's lease. `compile_cache` holds JAX's persistent compilation cache (default:
    under the model cache). `audit_key` signs the run's ledger (a SecretStr: Prefect shows
    it masked).
    """
    return run_recipe(
        recipe,
        root,
        deadline,
        cache_dir,
        allow_changes,
        recipe_source,
        lease_wait_seconds,
        overrides,
        compile_cache,
        audit_key,
    )


def run_recipe(
    recipe: Recipe,
    root: str,
    deadline: float | None,
    cache_dir: str | None,
    allow_changes: list[str] | None = None,
    recipe_source: str = "",
    lease_wait_seconds: float = lease.DEFAULT_WAIT_SECONDS,
    overrides: list[str] | None = None,
    compile_cache: str | None = None,
    audit_key: SecretStr | None = None,
) -> RunSummary:
    """The pipeline inside the calling flow run (this flow, or the scheduled deployment's).

    The session first takes the run's lease (one writer per run; pipeline/lease.py), holds
    it while it works and releases it at the end. Then the run's manifest is checked (drift
    guard) and this session recorded in it, with any expired lease it took over.
    """
    started = time.perf_counter()
    stop = StopFlag()
    ctx = RunContext(
        root=root,
        run=recipe.name,
        deadline=deadline,
        flow_run_id=str(runtime.flow_run.id),
        cache_dir=cache_dir,
        stop=stop,
        allow_changes=tuple(allow_changes or ()),
        sandbox_isolation=recipe.sandbox.isolation,
        sandbox_workers=recipe.sandbox.workers,
        reward_call_seconds=recipe.sandbox.reward_call_seconds,
        primary=is_primary_process(),
        shared=SharedBuilds(),  # the base network and tokenizer, built once for all stages
        audit_key=audit_key,
    )
    # the one place a run sets JAX's compilation cache: before any stage compiles
    compile_cache_lib.enable(compile_cache or ctx.model_cache)
    if not ctx.primary:  # process 0 holds the lease and writes the manifest for all
        with _sigterm_stops(ctx):
            return _run_stages(recipe, ctx, [], started)
    with lease.held(ctx.run_uri, ctx.flow_run_id, lease_wait_seconds, on_lost=stop.abort) as held:
        ctx = dataclasses.replace(ctx, fence=held.check)  # every commit checks the lease
        took_over = None
        if held.took_over is not None:
            took_over = {**held.took_over.model_dump(mode="json"), "reason": held.took_over_reason}
        changes = manifest.open_session(recipe, ctx, recipe_source, took_over, overrides or ())
        for change in changes:
            get_run_logger().warning("continuing with an allowed change: %s", change)
        publish_to_ui("flow run", lambda: _label_flow_run(recipe, ctx, recipe_source))
        done: list[StageSummary] = []
        try:
            with _sigterm_stops(ctx):
                summary = _run_stages(recipe, ctx, done, started)
        except Exception as e:  # noted in run.json, so `far status` says why it ended
            _close_failed(ctx, done, e)
            raise
        _close_session(ctx, summary)
    return _published(recipe, ctx, summary)


def _published(recipe: Recipe, ctx: RunContext, summary: RunSummary) -> RunSummary:
    """The summary with the run's ledger root, published outside run storage too."""
    root = ledger.root(ctx.run_uri)
    if root is None:
        return summary
    get_run_logger().info("ledger root %s (far audit --expect-root keeps storage honest)", root)
    publish_to_ui(
        "ledger",
        lambda: publish_ledger(
            run_label(recipe.name, ctx.run_uri), ctx.run_uri, root, ctx.audit_key is not None
        ),
    )
    return summary.model_copy(update={"ledger_root": root})


def _close_failed(ctx: RunContext, done: list[StageSummary], error: Exception) -> None:
    if isinstance(error, LeaseLost):  # another session owns the run now: write nothing
        return
    stages = {s.stage: "skipped" if s.skipped else "ran" for s in done}
    reason = " ".join(f"{type(error).__name__}: {error}".split())[:300]
    try:
        manifest.close_session(
            ctx.run_uri, ctx.flow_run_id, stages, f"failed: {reason}", ctx.audit_key
        )
    except Exception as note_error:  # the original error matters more than the note
        get_run_logger().warning("could not note the failed session: %s", note_error)


@contextmanager
def _sigterm_stops(ctx: RunContext) -> Iterator[None]:
    """SIGTERM (a preemption notice) or a first Ctrl-C makes training save and stop (a second
    Ctrl-C aborts); main thread only."""
    if ctx.stop is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    with stop_on_sigterm(ctx.stop):
        yield


def _run_stages(
    recipe: Recipe, ctx: RunContext, done: list[StageSummary], started: float
) -> RunSummary:
    """One task per node of the recipe's DAG, in topological order. Each task waits for the
    states of its upstream nodes (`wait_for`), so the UI's run graph draws the DAG's edges."""
    dag = build_dag(recipe)
    outputs: dict[str, Artifact] = {}
    states: dict[str, State[Any]] = {}
    try:
        for node in dag.nodes:
            inputs = {name: outputs[source] for name, source in node.inputs.items()}
            states[node.id] = stage_task.with_options(name=node.id)(
                recipe,
                node,
                node_config(recipe, node),
                inputs,
                ctx,
                wait_for=[states[source] for source in dag.upstream(node.id)],
                return_state=True,
            )
            outputs[node.id], line = states[node.id].result()
            done.append(line)
    except SessionExpired as e:
        if _made_no_progress(ctx, done, e):
            get_run_logger().warning("stopping without progress: %s", e)
            summary = _summary(recipe, ctx, done, started, stopped_reason=str(e))
            return summary.model_copy(update={"no_progress": True})
        get_run_logger().warning("stopping: %s; run the same command again to continue", e)
        return _summary(recipe, ctx, done, started, stopped_reason=str(e))
    return _summary(recipe, ctx, done, started)


def _made_no_progress(ctx: RunContext, done: list[StageSummary], stop: SessionExpired) -> bool:
    """No stage ran to its commit, and the stopping one took no step, at the deadline (a
    signal's stop is a preemption, not a budget too small)."""
    signalled = ctx.stop is not None and ctx.stop.is_set()
    return isinstance(stop, NoProgress) and not signalled and all(s.skipped for s in done)


def _close_session(ctx: RunContext, summary: RunSummary) -> None:
    stages = {s.stage: "skipped" if s.skipped else "ran" for s in summary.stages}
    outcome = "complete" if summary.complete else f"stopped: {summary.stopped_reason}"
    if summary.no_progress:
        outcome = f"stopped without progress: {summary.stopped_reason}"
    ctx.check_fence()
    manifest.close_session(ctx.run_uri, ctx.flow_run_id, stages, outcome, ctx.audit_key)


def _summary(
    recipe: Recipe,
    ctx: RunContext,
    done: list[StageSummary],
    started: float,
    stopped_reason: str | None = None,
) -> RunSummary:
    return RunSummary(
        run=recipe.name,
        run_uri=ctx.run_uri,
        complete=stopped_reason is None,
        stages=done,
        seconds=time.perf_counter() - started,
        stopped_reason=stopped_reason,
    )
