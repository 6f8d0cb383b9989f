"""Per-step progress of a training or evaluation stage, for people watching a run.

A stage wraps the iterator that feeds its steps in `reporting(...)`; each step it hands a
ProgressUpdate (step/total, s/step, ETA and the latest loss or reward) to the run's
`RunContext.progress` callback. The callback is a plain callable so stages stay free of any
orchestrator: `far` draws one bar per stage on a terminal or a log line every N seconds
elsewhere (ProgressPrinter), and flows/ also mirrors it into the Prefect UI.

The rate behind s/step and the ETA is the steady one (StepRate): the median of this
session's latest step times, leaving out the first step, which holds the XLA compilation (a
first step of 3 s before steps of 0.3 s made a 79 s stage say "ETA 41 min"). A resumed stage
counts from the step it resumed at, and its rate from the steps this session took.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

from tqdm import tqdm

log = logging.getLogger(__name__)
T = TypeVar("T")
Clock = Callable[[], float]
STEADY_WINDOW = 20  # the step times the steady rate is the median of
FALLBACK_COLUMNS = 100  # a terminal that reports no size (a bare pty)


@dataclass(frozen=True)
class ProgressUpdate:
    stage: str
    step: int  # steps done, counting earlier sessions
    total: int
    seconds_per_step: float | None  # this session's steady rate, None before it is known
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. loss, reward

    @property
    def eta_seconds(self) -> float | None:
        if self.seconds_per_step is None:
            return None
        return max(0, self.total - self.step) * self.seconds_per_step

    @property
    def finished(self) -> bool:
        return self.step >= self.total

    def counts(self) -> str:
        """'sft 40/150 (27%) loss 1.234'."""
        percent = 100 * self.step / self.total if self.total else 100.0
        parts = [f"{self.stage} {self.step}/{self.total} ({percent:.0f}%)"]
        parts += [f"{k} {v:.4g}" for k, v in self.metrics.items() if math.isfinite(v)]
        return " ".join(parts)

    def rate(self) -> str:
        """'0.21 s/step | ETA 23 s'; 'ETA ?' until the steady rate is known."""
        if self.seconds_per_step is None:
            return "ETA ?" if not self.finished else ""
        return f"{self.seconds_per_step:.3g} s/step | ETA {_duration(self.eta_seconds)}"

    def describe(self) -> str:
        """'sft 40/150 (27%) loss 1.234 | 0.21 s/step | ETA 23 s'."""
        rate = self.rate()
        return f"{self.counts()} | {rate}" if rate else self.counts()


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


class StepRate:
    """Seconds per step at the steady rate: the median of the last `window` step times of
    this session, the first step (compilation) left out; None until a second step is done.
    `steady` replaces the median (evaluation takes the mean of all its batches after the
    first, since each model's first batch loads it again, and that recurs until the end).

    `clock` is passed in (time.perf_counter by default) so a test drives it."""

    def __init__(
        self,
        clock: Clock = time.perf_counter,
        window: int | None = STEADY_WINDOW,
        steady: Callable[[deque[float]], float] = statistics.median,
    ) -> None:
        self.clock, self.steady = clock, steady
        self.last = clock()
        self.steps = 0
        self.times: deque[float] = deque(maxlen=window)

    def restart(self) -> None:
        """The next step starts now (after items the consumer skips, or a pause)."""
        self.last = self.clock()

    def step(self, count: int = 1) -> None:
        """`count` more steps are done now."""
        now = self.clock()
        if self.steps and count:
            self.times.append((now - self.last) / count)
        self.steps += count
        self.last = now

    @property
    def seconds_per_step(self) -> float | None:
        return self.steady(self.times) if self.times else None


def reporting(
    items: Iterator[T],
    callback: ProgressCallback | None,
    stage: str,
    start_step: int,
    total: int,
    items_per_step: int = 1,
    metrics: Callable[[], dict[str, float]] | None = None,
    skip: int = 0,
    clock: Clock = time.perf_counter,
) -> Iterator[T]:
    """`items` unchanged; after each full step's items, `callback` gets the progress so far.

    `items_per_step` > 1 for gradient accumulation (one step per that many micro-batches).
    `metrics` is read after each step (the latest loss or reward the stage has logged).
    `skip`: items the consumer reads and discards before its first step (Tunix's SFT
    trainer, resumed at `start_step`, re-reads the batches it already trained on), counted
    as no step, so the resumed offset is counted once.
    """
    if callback is None:
        yield from items
        return
    rate, consumed = StepRate(clock), 0
    for item in items:
        yield item  # the consumer runs the step before asking for the next item
        consumed += 1
        if consumed <= skip:
            rate.restart()  # this session's rate starts after the skipping
            continue
        if (consumed - skip) % items_per_step:
            continue
        rate.step()
        latest = metrics() if metrics is not None else {}
        step = start_step + (consumed - skip) // items_per_step
        callback(ProgressUpdate(stage, step, total, rate.seconds_per_step, latest))


def report_end(
    callback: ProgressCallback | None,
    stage: str,
    start_step: int,
    step: int,
    total: int,
    seconds: float,
    metrics: dict[str, float],
) -> None:
    """The progress at the end of a training session, after the trainer returned: a trainer
    that reads its data ahead (Tunix's GRPO learner) never asks for the item after its last
    step, so `reporting` alone would not see the last steps finish."""
    if callback is None:
        return
    per_step = seconds / (step - start_step) if step > start_step else None
    callback(ProgressUpdate(stage, step, total, per_step, metrics))


class ProgressPrinter:
    """A ProgressCallback for people. On a terminal: one bar per stage, redrawn in place
    (step/total, loss or reward, s/step and ETA), which the run's log lines never run into:
    while a bar is drawn, every log handler writing to the same terminal writes through
    tqdm, which clears the bar, writes the line and draws the bar again below it. Elsewhere
    (a log file, CI): one log line every `every_seconds` or `every_steps`, and always at the
    first and last step. `clock` (time.monotonic by default) paces the log lines."""

    def __init__(
        self,
        stream: TextIO | None = None,
        every_seconds: float = 30.0,
        every_steps: int = 0,
        tty: bool | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = _is_terminal(self.stream) if tty is None else tty
        self.every_seconds, self.every_steps = every_seconds, every_steps
        self.clock = clock
        self.last_printed: dict[str, float] = {}
        self.bars: dict[str, tqdm[Any]] = {}
        self.redirected: list[tuple[logging.StreamHandler[Any], Any, Any]] = []

    def __call__(self, update: ProgressUpdate) -> None:
        if self.tty:
            self._draw(update)
        elif self._due(update):
            log.info("progress: %s", update.describe())

    def close(self) -> None:
        """End every bar where it stands (a stage stopped early) and give the log handlers
        their own streams back."""
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()
        for handler, stream, console_file in self.redirected:
            handler.setStream(stream)
            if console_file is not None:
                handler.console.file = console_file  # type: ignore[attr-defined]
        self.redirected.clear()

    def __enter__(self) -> ProgressPrinter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _due(self, update: ProgressUpdate) -> bool:
        now = self.clock()
        last = self.last_printed.get(update.stage)
        due = (
            last is None
            or update.finished
            or now - last >= self.every_seconds
            or (self.every_steps > 0 and update.step % self.every_steps == 0)
        )
        if due:
            self.last_printed[update.stage] = now
        return due

    def _draw(self, update: ProgressUpdate) -> None:
        bar = self.bars.get(update.stage)
        if bar is None:
            self._redirect_log_handlers()
            bar = tqdm(
                total=update.total,
                initial=min(update.step, update.total),  # a resumed stage starts where it is
                file=self.stream,
                desc=update.stage,
                bar_format="{desc} {n_fmt}/{total_fmt} |{bar}| {percentage:3.0f}%{postfix}",
                dynamic_ncols=_columns(self.stream) > 0,
                ncols=None if _columns(self.stream) > 0 else FALLBACK_COLUMNS,
                mininterval=0.1,
                leave=True,
            )
            self.bars[update.stage] = bar
        postfix = " ".join(f"{k} {v:.4g}" for k, v in update.metrics.items() if math.isfinite(v))
        rate = update.rate()
        bar.postfix = " | ".join(part for part in (postfix, rate) if part)  # tqdm adds ", "
        bar.n = min(update.step, update.total)
        bar.refresh()
        if update.finished:
            bar.close()
            del self.bars[update.stage]

    def _redirect_log_handlers(self) -> None:
        """Every console handler (logging's, Prefect's rich one) that writes to this
        terminal writes through tqdm from now until `close`."""
        if self.redirected:
            return
        through = _ThroughBars(self.stream)
        for logger in _all_loggers():
            for handler in logger.handlers:
                if not isinstance(handler, logging.StreamHandler):
                    continue
                if not _same_terminal(handler.stream, self.stream):
                    continue
                console = getattr(handler, "console", None)  # Prefect's rich Console
                console_file = getattr(console, "file", None)
                stream = handler.stream
                try:
                    handler.setStream(through)
                except AttributeError:  # logging's last resort: always the current sys.stderr
                    continue
                self.redirected.append((handler, stream, console_file))
                if console is not None:
                    console.file = through


class _ThroughBars:
    """A stream whose writes clear the bars drawn on `stream`, write, and draw them again."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        with tqdm.external_write_mode(file=self.stream):
            written = self.stream.write(text)
            self.stream.flush()
        return written

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.stream.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _all_loggers() -> list[logging.Logger]:
    named = logging.Logger.manager.loggerDict.values()
    return [logging.getLogger(), *(x for x in named if isinstance(x, logging.Logger))]


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed, or no such method
        return False


def _columns(stream: Any) -> int:
    """The terminal's width; 0 when it reports none."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def _same_terminal(a: Any, b: Any) -> bool:
    """The same stream, or two streams on the same terminal (stderr and stdout on a tty)."""
    if a is b:
        return True
    if isinstance(a, _ThroughBars) or not (_is_terminal(a) and _is_terminal(b)):
        return False
    try:
        return os.ttyname(a.fileno()) == os.ttyname(b.fileno())
    except (AttributeError, OSError, ValueError):
        return False
