"""What a session does with a stage (skip, continue or run), decided from storage alone.

`run_stage` acts on the decision and `far validate` shows it (plan mode raises StageWouldRun
with it instead of working), so the plan is the run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.record import StageRecord
from stages.core import drift, storage
from stages.core.context import RunContext
from stages.core.identity import StageIdentity, identity_changes
from stages.core.records import IDENTITY_NAME, RECORD_NAME, read_record, verify_before_reuse


def stage_directory(ctx: RunContext, stage: str, digest: str) -> str:
    return storage.join(ctx.run_uri, f"{ctx.directory_name(stage)}-{digest[:12]}")


@dataclass(frozen=True)
class Decision:
    """What a session does with a stage, decided from storage alone: the one decision that
    `run_stage` acts on and `far validate` shows (pipeline/plan.py), so the plan is the run's.

    skip: its record is committed and still matches its files (else TamperedStage is raised);
    continue: its directory was started before and resumes there, or (`previous` set) an
    allowed continuation setting carries the previous directory's checkpoints over; run: it
    starts from nothing. An unallowed change from the previous directory raises DriftError.
    """

    action: Literal["skip", "continue", "run"]
    directory: str
    detail: str
    record: StageRecord | None = None  # skip: the committed record
    previous: str | None = None  # the node's earlier directory this one is compared with
    changes: tuple[drift.Change, ...] = ()  # allowed changes from `previous`


class StageWouldRun(Exception):  # not an error: how plan mode hands back a decision
    """Raised by `run_stage` in plan mode (RunContext.plan_only) instead of doing the work."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(f"{decision.action}: {decision.detail}")
        self.decision = decision


def decide(ctx: RunContext, identity: StageIdentity, carry_over: tuple[str, ...] = ()) -> Decision:
    """Skip, continue or run `identity` in this run: reads records and identities only.

    Raises TamperedStage (a committed stage whose files no longer match its record) and
    DriftError (an unallowed change from the node's previous directory), as a run would.
    """
    directory = stage_directory(ctx, identity.stage, identity.digest)
    record_uri = storage.join(directory, RECORD_NAME)
    record = read_record(record_uri)
    if record is not None:
        verify_before_reuse(record_uri, record)
        return Decision("skip", directory, "complete", record)
    if storage.exists(storage.join(directory, IDENTITY_NAME)):
        return Decision("continue", directory, "started before, not committed: resumes it")
    node = ctx.directory_name(identity.stage)
    previous = previous_directory(ctx, node, directory)
    if previous is None:
        return Decision("run", directory, "not started")
    changes = identity_changes(storage.read_json(storage.join(previous, IDENTITY_NAME)), identity)
    sections = [key for key in identity.config if key != "model"]  # model: the recipe's
    drift.check(
        f"stage {identity.stage}", changes, drift.node_allowances(ctx.allow_changes, node, sections)
    )
    shown = "; ".join(str(c) for c in changes) or "an input changed"
    if carry_over and changes and drift.continuable(changes):
        detail = f"from {previous.rsplit('/', 1)[-1]}'s checkpoint in a new directory ({shown})"
        return Decision("continue", directory, detail, None, previous, tuple(changes))
    return Decision("run", directory, shown, None, previous, tuple(changes))


def previous_directory(ctx: RunContext, stage: str, exclude: str) -> str | None:
    """The run's most recently started directory of `stage` (a node id) other than `exclude`."""
    started = []
    for name in storage.list_dirs(ctx.run_uri):
        candidate = storage.join(ctx.run_uri, name)
        identity_uri = storage.join(candidate, IDENTITY_NAME)
        if name.startswith(f"{stage}-") and candidate != exclude and storage.exists(identity_uri):
            started.append((storage.read_json(identity_uri)["created_at"], candidate))
    return max(started)[1] if started else None
