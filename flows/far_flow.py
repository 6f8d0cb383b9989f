"""The format_align_reinforce flow: one Prefect task per stage, passing artifacts (URIs).

Prefect adds the run graph, logs, retries and UI artifacts. Whether a stage runs or is
skipped is decided by the stage itself from the records on storage, so task caching is off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from prefect import flow, get_run_logger, runtime, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, State

from flows.ui_artifacts import publish_stage
from schemas.artifacts import CheckpointArtifact, DatasetArtifact, EvalReport
from schemas.recipe import Recipe
from schemas.record import RunSummary, StageSummary
from stages import data_prep, evaluate, grpo, sft
from stages.runner import RunContext, SessionExpired, StageOutcome
from stages.sessions import StopFlag, stop_on_sigterm

T = TypeVar("T", bound=DatasetArtifact | CheckpointArtifact | EvalReport)


def _finish(run: str, stage: str, outcome: StageOutcome[T]) -> State[tuple[T, StageSummary]]:
    """Log and publish a stage's outcome; its task run ends Completed, or "Skipped" if skipped.

    A task that returns a State ends in that state, so a skipped stage shows as Skipped in the
    UI's task list and run graph. Calling the task then returns the State: `.result()` is the
    (output, summary) pair.
    """
    output = outcome.output
    verb = "skipped (already complete on storage)" if outcome.skipped else "ran"
    get_run_logger().info("%s %s -> %s", stage, verb, output.uri)
    publish_stage(run, stage, outcome)
    summary = StageSummary(
        stage=stage,
        output_uri=output.uri,
        record_uri=outcome.record_uri,
        skipped=outcome.skipped,
        seconds=outcome.seconds,
    )
    name, message = ("Skipped", f"{stage} {verb}") if outcome.skipped else ("Completed", None)
    return Completed(data=(output, summary), name=name, message=message)


@task(name="data_prep", cache_policy=NO_CACHE)
def data_prep_task(recipe: Recipe, ctx: RunContext) -> State[tuple[DatasetArtifact, StageSummary]]:
    outcome = data_prep.prepare(recipe.data, recipe.model, ctx)
    return _finish(recipe.name, "data_prep", outcome)


@task(name="sft", cache_policy=NO_CACHE)
def sft_task(
    recipe: Recipe, dataset: DatasetArtifact, ctx: RunContext
) -> State[tuple[CheckpointArtifact, StageSummary]]:
    outcome = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx)
    return _finish(recipe.name, "sft", outcome)


@task(name="grpo", cache_policy=NO_CACHE)
def grpo_task(
    recipe: Recipe, dataset: DatasetArtifact, policy: CheckpointArtifact, ctx: RunContext
) -> State[tuple[CheckpointArtifact, StageSummary]]:
    outcome = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)
    return _finish(recipe.name, "grpo", outcome)


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(
    recipe: Recipe,
    dataset: DatasetArtifact,
    checkpoints: dict[str, CheckpointArtifact],
    ctx: RunContext,
) -> State[tuple[EvalReport, StageSummary]]:
    wanted = {k: v for k, v in checkpoints.items() if k in recipe.eval.models}
    outcome = evaluate.evaluate(dataset, wanted, recipe.eval, recipe.model, recipe.mesh, ctx)
    return _finish(recipe.name, "evaluate", outcome)


@flow(name="format_align_reinforce", log_prints=True)
def format_align_reinforce(
    recipe: Recipe, root: str, deadline: float | None = None, cache_dir: str | None = None
) -> RunSummary:
    """data-prep -> SFT-format -> GRPO-reinforce -> evaluation for one recipe.

    `root` is the normalized storage root; `deadline` (epoch seconds) stops the run cleanly
    between stages when the session is over: re-running the same command continues.
    `cache_dir` holds converted model weights (default ~/.cache/far).
    """
    started = time.perf_counter()
    ctx = RunContext(
        root=root,
        run=recipe.name,
        deadline=deadline,
        flow_run_id=str(runtime.flow_run.id),
        cache_dir=cache_dir,
        stop=StopFlag(),
    )
    done: list[StageSummary] = []
    with _sigterm_stops(ctx):
        return _run_stages(recipe, ctx, done, started)


@contextmanager
def _sigterm_stops(ctx: RunContext) -> Iterator[None]:
    """SIGTERM (a preemption notice) makes training save and stop; main thread only."""
    if ctx.stop is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    with stop_on_sigterm(ctx.stop):
        yield


def _run_stages(
    recipe: Recipe, ctx: RunContext, done: list[StageSummary], started: float
) -> RunSummary:
    try:
        dataset, line = data_prep_task(recipe, ctx).result()
        done.append(line)
        policy, line = sft_task(recipe, dataset, ctx).result()
        done.append(line)
        reinforced, line = grpo_task(recipe, dataset, policy, ctx).result()
        done.append(line)
        checkpoints = {"sft": policy, "grpo": reinforced}
        _, line = evaluate_task(recipe, dataset, checkpoints, ctx).result()
        done.append(line)
    except SessionExpired as e:
        get_run_logger().warning("stopping: %s; run the same command again to continue", e)
        return _summary(recipe, ctx, done, started, stopped_reason=str(e))
    return _summary(recipe, ctx, done, started)


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
