"""Per-step progress of a training or evaluation stage, for people watching a run.

A stage wraps the iterator that feeds its steps in `reporting(...)`; each step it hands a
ProgressUpdate (step/total, s/step, ETA and the latest loss or reward) to the run's
`RunContext.progress` callback. The callback is a plain callable so stages stay free of any
orchestrator: `far` prints a bar on a terminal or a log line every N seconds elsewhere
(ProgressPrinter), and flows/ also mirrors it into the Prefect UI.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TextIO, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class ProgressUpdate:
    stage: str
    step: int  # steps done, counting earlier sessions
    total: int
    seconds_per_step: float | None  # this session's mean, None before two steps
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. loss, reward
    # the stage's library draws its own terminal bar (Tunix's SFT trainer does, on a TTY)
    library_bar: bool = False

    @property
    def eta_seconds(self) -> float | None:
        if self.seconds_per_step is None:
            return None
        return max(0, self.total - self.step) * self.seconds_per_step

    def describe(self) -> str:
        """'sft 40/150 (27%) loss 1.234 | 0.21 s/step | ETA 23 s'."""
        percent = 100 * self.step / self.total if self.total else 100.0
        parts = [f"{self.stage} {self.step}/{self.total} ({percent:.0f}%)"]
        parts += [f"{k} {v:.4g}" for k, v in self.metrics.items() if math.isfinite(v)]
        line = " ".join(parts)
        if self.seconds_per_step is not None:
            line += f" | {self.seconds_per_step:.3g} s/step | ETA {_duration(self.eta_seconds)}"
        return line


ProgressCallback = Callable[[ProgressUpdate], None]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    whole = round(seconds)
    if whole < 120:
        return f"{whole} s"
    if whole < 7200:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def reporting(
    items: Iterator[T],
    callback: ProgressCallback | None,
    stage: str,
    start_step: int,
    total: int,
    items_per_step: int = 1,
    metrics: Callable[[], dict[str, float]] | None = None,
    library_bar: bool = False,
    skip: int = 0,
) -> Iterator[T]:
    """`items` unchanged; after each full step's items, `callback` gets the progress so far.

    `items_per_step` > 1 for gradient accumulation (one step per that many micro-batches).
    `metrics` is read after each step (the latest loss or reward the stage has logged);
    `library_bar` says the training library already draws a bar on a terminal. `skip`: items
    the consumer reads and discards before its first step (Tunix's SFT trainer, resumed at
    `start_step`, re-reads the batches it already trained on), counted as no step, so the
    resumed offset is counted once.
    """
    if callback is None:
        yield from items
        return
    started, consumed = time.perf_counter(), 0
    for item in items:
        yield item  # the consumer runs the step before asking for the next item
        consumed += 1
        if consumed <= skip:
            started = time.perf_counter()  # this session's s/step starts after the skipping
            continue
        if (consumed - skip) % items_per_step:
            continue
        done = (consumed - skip) // items_per_step
        per_step = (time.perf_counter() - started) / done
        latest = metrics() if metrics is not None else {}
        step = start_step + done
        callback(ProgressUpdate(stage, step, total, per_step, latest, library_bar))


def report_end(
    callback: ProgressCallback | None,
    stage: str,
    start_step: int,
    step: int,
    total: int,
    seconds: float,
    metrics: dict[str, float],
    library_bar: bool = False,
) -> None:
    """The progress at the end of a training session, after the trainer returned: a trainer
    that reads its data ahead (Tunix's GRPO learner) never asks for the item after its last
    step, so `reporting` alone would not see the last steps finish."""
    if callback is None:
        return
    per_step = seconds / (step - start_step) if step > start_step else None
    callback(ProgressUpdate(stage, step, total, per_step, metrics, library_bar))


class ProgressPrinter:
    """A ProgressCallback for people: a redrawn bar on a terminal; elsewhere (a log file, CI)
    one log line every `every_seconds` or `every_steps`, and always at the last step."""

    def __init__(
        self,
        stream: TextIO | None = None,
        every_seconds: float = 30.0,
        every_steps: int = 0,
        tty: bool | None = None,
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_seconds, self.every_steps = every_seconds, every_steps
        self.last_printed: dict[str, float] = {}

    def __call__(self, update: ProgressUpdate) -> None:
        if self.tty:
            if not update.library_bar:  # never two bars for one stage
                self._draw(update)
        elif self._due(update):
            log.info("progress: %s", update.describe())

    def _due(self, update: ProgressUpdate) -> bool:
        now = time.monotonic()
        last = self.last_printed.get(update.stage)
        due = (
            last is None
            or update.step >= update.total
            or now - last >= self.every_seconds
            or (self.every_steps > 0 and update.step % self.every_steps == 0)
        )
        if due:
            self.last_printed[update.stage] = now
        return due

    def _draw(self, update: ProgressUpdate) -> None:
        width = 24
        filled = int(width * min(1.0, update.step / update.total)) if update.total else width
        bar = "#" * filled + "-" * (width - filled)
        end = "\n" if update.step >= update.total else ""
        self.stream.write(f"\r[{bar}] {update.describe()}\033[K{end}")
        self.stream.flush()
