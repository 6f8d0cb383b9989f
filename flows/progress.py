"""Stage progress for the two audiences of a run: the terminal and the Prefect UI.

Stages report per-step progress through the plain callable RunContext.progress (they never
import Prefect). `stage_progress` builds that callable for a flow run: it prints (a bar on a
terminal, a log line every 30 s elsewhere) and keeps one Prefect progress artifact per stage
up to date, so the UI shows step/total, loss or reward and the ETA while the stage runs.
"""

from __future__ import annotations

import logging
import time
from uuid import UUID

import httpx
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from stages.core.progress import ProgressCallback, ProgressPrinter, ProgressUpdate

log = logging.getLogger(__name__)
UI_UPDATE_SECONDS = 5.0  # at most one API call per stage per this many seconds


class PrefectProgress:
    """A ProgressCallback that mirrors each stage's progress into a Prefect progress artifact
    (key `{run}-{stage}-progress`); an unreachable API is logged once, never fatal."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.artifacts: dict[str, UUID] = {}
        self.last_sent: dict[str, float] = {}
        self.unreachable = False

    def __call__(self, update: ProgressUpdate) -> None:
        now = time.monotonic()
        final = update.step >= update.total
        recent = now - self.last_sent.get(update.stage, -UI_UPDATE_SECONDS) < UI_UPDATE_SECONDS
        if self.unreachable or (recent and not final):
            return
        self.last_sent[update.stage] = now
        percent = 100.0 * min(1.0, update.step / update.total) if update.total else 100.0
        try:
            self._send(update, percent)
        except httpx.TransportError as e:
            self.unreachable = True
            log.warning("Prefect API unreachable, progress no longer shown in the UI: %r", e)

    def _send(self, update: ProgressUpdate, percent: float) -> None:
        artifact = self.artifacts.get(update.stage)
        if artifact is None:
            key = f"{self.run}-{update.stage}-progress".replace("_", "-").replace(".", "-")
            self.artifacts[update.stage] = create_progress_artifact(
                percent, key=key, description=update.describe()
            )
        else:
            update_progress_artifact(artifact, percent, description=update.describe())


def stage_progress(run: str) -> ProgressCallback:
    """Print progress and mirror it into the Prefect UI."""
    printer, ui = ProgressPrinter(), PrefectProgress(run)

    def report(update: ProgressUpdate) -> None:
        printer(update)
        ui(update)

    return report
