"""Stage progress for the two audiences of a run: the terminal and the Prefect UI.

Stages report per-step progress through the plain callable RunContext.progress (they never
import Prefect). `stage_progress` sets that callable inside a stage's task run: it
prints (one bar per stage on a terminal, a log line every 30 s elsewhere)
and keeps one Prefect progress artifact per stage up to date, so the UI shows step/total,
loss or reward and the ETA while the stage runs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID

import httpx
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate
from prefect.utilities.context import get_task_and_flow_run_ids

from flows.ui_artifacts import artifact_key
from stages.core.progress import ProgressPrinter, ProgressUpdate
from stages.core.runner import RunContext

log = logging.getLogger(__name__)
UI_UPDATE_SECONDS = 5.0  # at most one API call per stage per this many seconds


class PrefectProgress:
    """A ProgressCallback that keeps one Prefect progress artifact per stage up to date (key
    `far-{run}-{id}-{stage}-progress`, like the stage's other artifacts; `run` is the run's
    label, ui_artifacts.run_label), created at the first step (a skipped stage gets none).
    Built inside the stage's task run, whose ids it keeps:
    the updates may come from another thread (Tunix's GRPO learner consumes its data on its
    own). An unreachable API is logged once, never fatal."""

    def __init__(self, run: str, stage: str) -> None:
        self.key = artifact_key(run, stage, "progress")
        self.task_run_id, self.flow_run_id = get_task_and_flow_run_ids()
        self.last_sent = -UI_UPDATE_SECONDS
        self.artifact: UUID | None = None
        self.unreachable = False

    def __call__(self, update: ProgressUpdate) -> None:
        now = time.monotonic()
        final = update.step >= update.total
        if self.unreachable or (now - self.last_sent < UI_UPDATE_SECONDS and not final):
            return
        self.last_sent = now
        percent = 100.0 * min(1.0, update.step / update.total) if update.total else 100.0
        try:
            self._send(percent, update.describe())
        except httpx.TransportError as e:
            self.unreachable = True
            log.warning("Prefect API unreachable, progress no longer shown in the UI: %r", e)

    def _send(self, percent: float, description: str) -> None:
        client = get_client(sync_client=True)
        if self.artifact is None:
            request = ArtifactCreate(
                type="progress",
                key=self.key,
                description=description,
                data=percent,
                task_run_id=self.task_run_id,
                flow_run_id=self.flow_run_id,
            )
            self.artifact = client.create_artifact(artifact=request).id
        else:
            client.update_artifact(
                artifact_id=self.artifact,
                artifact=ArtifactUpdate(data=percent, description=description),
            )


@contextmanager
def stage_progress(ctx: RunContext, run: str, stage: str) -> Iterator[RunContext]:
    """`ctx` whose progress callback prints and mirrors `stage` into the Prefect UI; enter it
    inside the stage's task run. Leaving it ends the stage's terminal bar where it stands (a
    stage stopped early) and gives the log handlers their streams back."""
    ui = PrefectProgress(run, stage)
    with ProgressPrinter() as printer:

        def report(update: ProgressUpdate) -> None:
            printer(update)
            ui(update)

        yield dataclasses.replace(ctx, progress=report)
