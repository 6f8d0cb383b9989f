"""A run as a whole: its manifest (run.json) and its progress, read from storage alone.

`open_session` is called once per session (a `far run`, `far resume` or a scheduled run): it
refuses a recipe that drifted from the one the run started with (stages/core/drift.py) and appends
the session to the manifest. `run_status` answers `far status` from the stage directories, so
it works from any machine, with or without the Prefect server that ran them.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import SecretStr, ValidationError

from pipeline import plugins
from pipeline.dag import node_order
from schemas.recipe import Recipe
from schemas.record import Invocation, RunManifest
from stages.core import drift, ledger, storage
from stages.core.errors import InputError, MissingInput
from stages.core.records import (
    IDENTITY_NAME,
    RECORD_NAME,
    SESSIONS_DIR,
    located_output,
    read_record,
)
from stages.core.runner import RunContext
from stages.evaluate import progress

MANIFEST_NAME = "run.json"


def manifest_uri(run_uri: str) -> str:
    return storage.join(run_uri, MANIFEST_NAME)


class TornManifest(InputError):
    """A run.json that is not JSON or not a manifest of this schema (a torn write or an edit):
    nothing can be planned or resumed from it, and nothing in it is guessed."""


def read_manifest(run_uri: str) -> RunManifest:
    uri = manifest_uri(run_uri)
    if not storage.exists(uri):
        raise MissingInput(
            f"no FAR run at {run_uri}: expected {MANIFEST_NAME} there (give the run's URI, "
            f"{{storage_root}}/{{name}}, as `far run` printed it)"
        )
    try:
        return RunManifest.model_validate(storage.read_json(uri))
    except ValueError as e:  # not JSON, not UTF-8, or not a manifest (ValidationError)
        reason = " ".join(str(e).split())[:160]
        raise TornManifest(
            f"{uri} is unreadable (a torn write or an edit: {reason}); restore it from a "
            f"copy, or start a new run under another --name (`far audit {run_uri}` lists "
            f"what the stage records still vouch for)"
        ) from e


def with_current_defaults(recorded: dict[str, Any]) -> dict[str, Any]:
    """A run's recorded recipe as this code reads it: a field added since the run started
    takes its default, which is not a change. (A recorded recipe this schema no longer
    accepts is compared as recorded, so its differences show as changes.)"""
    try:
        return Recipe.model_validate(recorded).model_dump(mode="json")
    except ValidationError:
        return recorded


def open_session(
    recipe: Recipe,
    ctx: RunContext,
    recipe_source: str,
    took_over: dict[str, Any] | None = None,
    overrides: Sequence[str] = (),
) -> list[drift.Change]:
    """Check the recipe against the run's manifest, then record this session in it: the
    expired lease it took over, if any, and the command line's KEY=VALUE `overrides` as given
    (the recipe already has them applied).

    Returns the accepted (allowed) changes; raises drift.DriftError for any other change.
    """
    new = recipe.model_dump(mode="json")
    uri = manifest_uri(ctx.run_uri)
    if storage.exists(uri):
        manifest = read_manifest(ctx.run_uri)
        changes = recipe_drift(recipe, manifest, ctx.allow_changes)
    else:
        manifest = RunManifest(
            run=ctx.run, recipe=new, recipe_source=recipe_source, created_at=datetime.now(UTC)
        )
        changes = []
    invocation = Invocation(
        started_at=datetime.now(UTC),
        flow_run_id=ctx.flow_run_id,
        host=socket.gethostname(),
        allowed_changes=list(ctx.allow_changes),
        changes=[str(c) for c in changes],
        took_over=took_over,
        overrides=list(overrides),
    )
    updated = manifest.model_copy(
        update={
            "recipe": new,
            "recipe_source": recipe_source,
            "invocations": [*manifest.invocations, invocation],
            "plugins": sorted({*manifest.plugins, *plugins.recorded_modules(recipe)}),
        }
    )
    write_manifest(ctx.run_uri, updated, ctx.audit_key)
    return changes


def recipe_drift(
    recipe: Recipe, manifest: RunManifest, allow_changes: Sequence[str]
) -> list[drift.Change]:
    """The recipe's changes from the one the run started with (its run.json), all allowed;
    drift.DriftError for any other. What `open_session` and `far validate`'s plan both check."""
    old = with_current_defaults(manifest.recipe)
    changes = drift.recipe_changes(old, recipe.model_dump(mode="json"))
    return drift.check("the recipe", changes, allow_changes)


def write_manifest(run_uri: str, updated: RunManifest, key: SecretStr | None = None) -> None:
    """Write run.json and chain it into the run's ledger (run.json is rewritten each session,
    so the audit compares it with its latest ledger entry)."""
    uri = manifest_uri(run_uri)
    storage.write_json(uri, updated.model_dump(mode="json"))
    ledger.append(run_uri, uri, "manifest", key)


def close_session(
    run_uri: str,
    flow_run_id: str | None,
    stages: dict[str, str],
    outcome: str,
    key: SecretStr | None = None,
) -> None:
    """Note how this session ended and which stages it ran or skipped (for lineage)."""
    manifest = read_manifest(run_uri)
    invocations = list(manifest.invocations)
    for i in range(len(invocations) - 1, -1, -1):
        if invocations[i].flow_run_id == flow_run_id and invocations[i].outcome is None:
            invocations[i] = invocations[i].model_copy(
                update={"stages": stages, "outcome": outcome}
            )
            break
    updated = manifest.model_copy(update={"invocations": invocations})
    write_manifest(run_uri, updated, key)


@dataclass(frozen=True)
class StageState:
    """Where one stage of a run stands."""

    stage: str
    state: str  # complete | partial | not started | superseded | unverified
    directory: str | None = None
    step: int | None = None  # latest committed checkpoint step (training stages)
    max_steps: int | None = None
    batches: int | None = None  # a partial evaluation's kept batches of completions
    sessions: int = 0  # sessions that worked on it (stopped, failed, or the completing one)
    seconds: float | None = None
    output_uri: str | None = None
    doubt: str = ""  # unverified: why its record is not taken as the run's own commit


def pipeline_order(manifest: RunManifest) -> tuple[str, ...]:
    """The node ids of the run's DAG (from the recipe in run.json), in topological order,
    read as data: no module the run names is imported (run.json is storage, and reading a
    run never runs code from it), so a node of a plugin's kind keeps its place unloaded."""
    return node_order(Recipe.model_validate(manifest.recipe))


def run_status(run_uri: str, doubts: Mapping[str, str] | None = None) -> list[StageState]:
    """Every node's current directory and state, plus superseded (drifted) directories.

    Node directories are {node id}-{hash}; `stage` in each StageState is the node id.
    `doubts` ({record URI: why}, from lineage.record_doubts) are records the audit has not
    seen sealed by the run's own writer: shown as unverified, never as a node's current stage.
    """
    doubts = doubts or {}
    order = pipeline_order(read_manifest(run_uri))  # a clear error when run_uri is not a run
    started: dict[str, list[tuple[str, str]]] = {node: [] for node in order}
    for name in storage.list_dirs(run_uri):
        stage = name.rsplit("-", 1)[0]
        identity_uri = storage.join(run_uri, name, IDENTITY_NAME)
        if stage in started and storage.exists(identity_uri):
            created = storage.read_json(identity_uri)["created_at"]
            started[stage].append((created, storage.join(run_uri, name)))
    states = []
    for stage in order:
        directories = [d for _, d in sorted(started[stage])]
        doubted = [d for d in directories if storage.join(d, RECORD_NAME) in doubts]
        states += [
            StageState(stage, "unverified", d, doubt=doubts[storage.join(d, RECORD_NAME)])
            for d in doubted
        ]
        directories = [d for d in directories if d not in doubted]
        if not directories:
            states.append(StageState(stage, "not started"))
            continue
        states += [StageState(stage, "superseded", d) for d in directories[:-1]]
        states.append(_directory_state(stage, directories[-1]))
    return states


def _directory_state(stage: str, directory: str) -> StageState:
    identity = storage.read_json(storage.join(directory, IDENTITY_NAME))
    max_steps = _max_steps(identity["config"])
    record_uri = storage.join(directory, RECORD_NAME)
    record = read_record(record_uri)
    if record is not None:
        step = getattr(record.output, "step", None)
        return StageState(
            stage,
            "complete",
            directory,
            step,
            max_steps,
            sessions=len(record.sessions),
            seconds=record.seconds,
            output_uri=located_output(record_uri, record).uri,
        )
    sessions = len(storage.list_files(storage.join(directory, SESSIONS_DIR)))
    return StageState(
        stage,
        "partial",
        directory,
        latest_checkpoint_step(directory),
        max_steps,
        batches=progress.kept_batches(directory) or None,
        sessions=sessions,
    )


def max_steps_of(directory: str) -> int | None:
    """The max_steps a started training stage's directory was started with (its identity)."""
    return _max_steps(storage.read_json(storage.join(directory, IDENTITY_NAME))["config"])


def _max_steps(config: dict[str, Any]) -> int | None:
    """A training stage's max_steps from its hashed config (any kind: sft, grpo, dpo, distill)."""
    for section in config.values():
        if isinstance(section, dict) and "max_steps" in section:
            return int(section["max_steps"])
    return None


def latest_checkpoint_step(directory: str) -> int | None:
    """The newest committed Orbax step under checkpoints/ (or checkpoints/actor/ for GRPO).

    Orbax writes a step into a temporary directory and renames it when complete, so only
    all-digit names are committed steps; a torn save is never counted.
    """
    for sub in ("checkpoints/actor", "checkpoints"):
        steps = [int(n) for n in storage.list_dirs(storage.join(directory, sub)) if n.isdigit()]
        if steps:
            return max(steps)
    return None
