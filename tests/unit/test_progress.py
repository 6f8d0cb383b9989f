"""Stage progress: counted once on a resume, timed at the steady rate (the first step, which
compiles, left out), one bar per stage on a real terminal that log lines never run into, and
log lines at a fixed cadence elsewhere. Clocks are passed in; the terminal is a real pty."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import re
import struct
import sys
import termios
from collections.abc import Iterator

import pytest

from stages.core.progress import ProgressPrinter, ProgressUpdate, StepRate, reporting
from stages.evaluate.progress import BatchTally


class FakeClock:
    """A clock the test moves: each step takes what the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def consume(stream: Iterator[int], clock: FakeClock, seconds: list[float]) -> list[int]:
    """A trainer: item i's step takes seconds[i] before it asks for the next item."""
    taken = []
    for item in stream:
        clock.now += seconds[item]
        taken.append(item)
    return taken


def test_a_resumed_trainer_that_rereads_its_trained_batches_reports_each_step_once() -> None:
    """Tunix's SFT trainer resumed at step 150 of 200 (2 micro-batches a step) reads the
    first 300 micro-batches again and skips them, then trains 100 more."""
    seen: list[ProgressUpdate] = []
    stream = reporting(iter(range(400)), seen.append, "sft", 150, 200, items_per_step=2, skip=300)
    assert list(stream) == list(range(400))
    assert [u.step for u in seen] == list(range(151, 201))
    assert seen[-1].describe().startswith("sft 200/200 (100%)")


def test_the_eta_comes_from_the_steady_rate_not_the_first_steps_compilation() -> None:
    """A first step of 40 s (XLA compiles) and then 0.25 s steps: the old mean said
    "ETA 41 min" after step 1 of a stage that took about a minute."""
    clock = FakeClock()
    seen: list[ProgressUpdate] = []
    stream = reporting(iter(range(150)), seen.append, "sft", 0, 150, clock=clock)
    assert consume(stream, clock, [40.0] + [0.25] * 149) == list(range(150))
    assert seen[0].seconds_per_step is None and seen[0].describe().endswith("| ETA ?")
    assert seen[1].seconds_per_step == pytest.approx(0.25)
    assert seen[9].eta_seconds == pytest.approx(140 * 0.25)
    assert seen[9].describe().endswith("| 0.25 s/step | ETA 35 s")


def test_a_resumed_stage_counts_from_its_step_and_times_this_sessions_steps_only() -> None:
    """Resumed at step 100 of 150, 2 micro-batches a step: the 200 micro-batches it re-reads
    (60 s) and its first step (20 s, compiling) are not this session's steady rate."""
    clock = FakeClock()
    seen: list[ProgressUpdate] = []
    stream = reporting(
        iter(range(250)), seen.append, "sft", 100, 150, items_per_step=2, skip=200, clock=clock
    )
    consume(stream, clock, [0.3] * 200 + [20.0, 0.0] + [0.5] * 48)
    assert seen[0].describe() == "sft 101/150 (67%) | ETA ?"
    assert seen[-1].step == 125 and seen[-1].seconds_per_step == pytest.approx(1.0)


def test_the_steady_rate_follows_a_change_of_pace() -> None:
    clock = FakeClock()
    rate = StepRate(clock, window=4)
    for took in (30.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0):
        clock.now += took
        rate.step()
    assert rate.seconds_per_step == 2.0  # the median of the last four


def test_evaluation_times_generated_batches_after_the_first_only() -> None:
    clock = FakeClock()
    seen: list[ProgressUpdate] = []
    tally = BatchTally(seen.append, 6, clock)
    for generated, took in ((False, 0.1), (False, 0.1), (True, 30.0), (True, 2.0), (True, 4.0)):
        clock.now += took
        tally.batch_done(generated)
    assert [u.step for u in seen] == [1, 2, 3, 4, 5]
    assert seen[2].seconds_per_step is None  # the first generated batch loads and compiles
    assert seen[-1].seconds_per_step == pytest.approx(3.0)
    assert seen[-1].eta_seconds == pytest.approx(3.0)


def test_progress_off_a_terminal_is_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    printer = ProgressPrinter(io.StringIO(), every_seconds=30, tty=False, clock=clock)
    with caplog.at_level("INFO", logger="stages.core.progress"):
        for step in range(1, 13):
            clock.now += 7
            printer(ProgressUpdate("grpo", step, 12, 0.5 if step > 1 else None, {"reward": 1.25}))
    lines = [r.getMessage() for r in caplog.records]
    # the first step, then once 30 s have passed (steps 6 and 11: 35 s apart), and the last
    assert [line.split()[2] for line in lines] == ["1/12", "6/12", "11/12", "12/12"]
    assert lines[0].endswith("| ETA ?")
    assert "reward 1.25 | 0.5 s/step | ETA 0 s" in lines[-1]


def screen(raw: str) -> list[str]:
    """The lines a terminal shows for `raw`: carriage returns, newlines, cursor-up and
    erase-to-end-of-line applied, any other escape sequence dropped."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;]*[A-Za-z]|.", raw, flags=re.DOTALL):
        if token == "\r":
            col = 0
        elif token == "\n":
            row += 1
            lines += [""] * (row + 1 - len(lines))
        elif token == "\x1b[A":
            row = max(0, row - 1)
        elif token.startswith("\x1b["):
            if token.endswith("K"):
                lines[row] = lines[row][:col]
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + 1 :]
            col += 1
    return [line.rstrip() for line in lines]


@pytest.fixture()
def terminal() -> Iterator[tuple[io.TextIOWrapper, int]]:
    """A real pseudo-terminal: (the program's side as a text stream, the reading fd)."""
    reader, program = os.openpty()
    fcntl.ioctl(program, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    stream = open(program, "w", buffering=1, closefd=True)  # noqa: SIM115
    yield stream, reader
    if not stream.closed:
        stream.close()
    os.close(reader)


def read_all(stream: io.TextIOWrapper, reader: int) -> str:
    stream.close()
    chunks = []
    while True:
        try:
            chunk = os.read(reader, 65536)
        except OSError:  # EIO: the program's side is closed and everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_on_a_terminal_each_stage_has_one_bar_and_log_lines_never_run_into_it(
    terminal: tuple[io.TextIOWrapper, int],
) -> None:
    stream, reader = terminal
    logger = logging.getLogger("test.progress.terminal")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("LOG %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    clock = FakeClock()
    try:
        with ProgressPrinter(stream) as printer:
            assert printer.tty  # found from the stream: a real terminal
            for step in range(101, 106):  # a resumed stage
                clock.now += 0.5
                printer(ProgressUpdate("sft", step, 105, 0.5, {"loss": 2.0 / step}))
                logger.info("sft step %d done", step)
            assert handler.stream is not stream  # written through the bars meanwhile
            for step in (1, 2):
                printer(ProgressUpdate("evaluate", step, 4, None))
                logger.info("evaluated model %d", step)
        assert handler.stream is stream  # given back when the printer closes
        logger.info("after the bars")
    finally:
        logger.removeHandler(handler)
    shown = [line for line in screen(read_all(stream, reader)) if line]
    logs = [line for line in shown if "LOG" in line]
    assert logs == [f"LOG sft step {s} done" for s in range(101, 106)] + [
        "LOG evaluated model 1",
        "LOG evaluated model 2",
        "LOG after the bars",
    ]
    bars = [line for line in shown if "LOG" not in line]
    assert len(bars) == 2, shown  # one line per stage, each redrawn in place
    assert bars[0].startswith("sft 105/105 |") and bars[0].endswith(
        "100%, loss 0.01905 | 0.5 s/step | ETA 0 s"
    )
    assert bars[1].startswith("evaluate 2/4 |") and bars[1].endswith("50%, ETA ?")
    # the finished bar stays above the lines logged after it; the live one is below its logs
    assert shown.index(bars[0]) == 4 and shown.index(bars[1]) == 8


def test_a_resumed_bar_starts_at_the_resumed_step(terminal: tuple[io.TextIOWrapper, int]) -> None:
    stream, reader = terminal
    printer = ProgressPrinter(stream)
    printer(ProgressUpdate("sft", 101, 150, None))
    printer.close()
    shown = [line for line in screen(read_all(stream, reader)) if line]
    assert len(shown) == 1 and shown[0].startswith("sft 101/150 |"), shown


def test_a_handler_whose_stream_cannot_be_replaced_is_left_alone(
    terminal: tuple[io.TextIOWrapper, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """logging's last-resort handler (a library attaches it) writes to whatever sys.stderr is
    now: it has no stream to replace, and a bar must not fail the stage over it."""
    stream, reader = terminal
    monkeypatch.setattr(sys, "stderr", stream)
    logger = logging.getLogger("test.progress.last_resort")
    logger.addHandler(logging.lastResort or logging.StreamHandler())
    try:
        with ProgressPrinter(stream) as printer:
            printer(ProgressUpdate("grpo", 1, 2, None))
    finally:
        logger.handlers.clear()
    assert "grpo 1/2 |" in read_all(stream, reader)
