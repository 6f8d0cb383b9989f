"""Stopping training cleanly before a session ends (a 9-hour Kaggle session, a preempted VM).

A training stage feeds its trainer through `guarded(...)`: the wrapped iterator stops yielding
batches once a stop is requested (SIGTERM, via `StopFlag`) or the time left before the run's
deadline would not cover one more step plus a save margin. The trainer then ends its loop
as if the data ran out and saves its last checkpoint; the stage sees it stopped short and
raises SessionExpired. Running the same command again resumes from that checkpoint.

A write that storage refuses (a full disk) in a library's background writer thread (Orbax's
async save, TensorBoard's event writer) is not left to hang the run: the thread's death aborts
the session (`SaveFailed`) and interrupts the main thread wherever it waits, so the session ends
within seconds, resumable from the last committed checkpoint.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, NoReturn, TypeVar

import numpy as np

from stages.core import storage

log = logging.getLogger(__name__)
T = TypeVar("T")


class LeaseLost(RuntimeError):
    """This session no longer holds the run's lease (another session took it over): it must
    stop at once and write nothing more (`far` exits with its own code)."""


# The write fence of the stage this process works on now: called before every checkpoint a
# library writes on FAR's behalf (Tunix's saves, Orbax's commit renames and deletions, patched
# in stages/modeling/tunix_compat.py) and every TensorBoard event write (FAR's own backend,
# stages/core/metrics_logging.py), from whichever thread writes. One stage at a time runs
# in a process, so one fence suffices; None outside a stage's work.
_write_fence: Callable[[], None] | None = None
_fence_passed = float("-inf")  # time.monotonic() of the last check that passed


@contextmanager
def fencing(check: Callable[[], None] | None) -> Iterator[None]:
    """Within the block, `check_writes()` calls `check`, which raises (LeaseLost) once this
    session may no longer write its stage: its lease was taken over, or another session
    committed the stage directory."""
    global _write_fence, _fence_passed
    previous, _write_fence, _fence_passed = _write_fence, check, float("-inf")
    try:
        yield
    finally:
        _write_fence, _fence_passed = previous, float("-inf")


def check_writes(within: float = 0.0) -> None:
    """Raise unless the stage being worked on may still be written (see `fencing`).

    `within`: for frequent small writes (event records), a check that passed less than that
    many seconds ago (monotonic) suffices. A process stopped longer than that (SIGSTOP past
    its lease) checks again at its next write, so a lease lost meanwhile is still found."""
    global _fence_passed
    fence = _write_fence
    if fence is None or time.monotonic() - _fence_passed < within:
        return
    fence()
    _fence_passed = time.monotonic()


class SaveFailed(RuntimeError):
    """Storage refused a write this session needed (a full disk, a quota): the session ends at
    once; everything committed before stays, so the same command continues once there is room
    (`far` exits with the code of a stopped session)."""


class StopFlag:
    """Set by a signal handler (or a test); read by training loops. Thread-safe.

    `request` asks for a clean stop (save, then stop); `abort` for an immediate one: the
    session raises the given error instead of saving (a session that lost its lease, a
    background write that failed). Within `stop_on_sigterm` an abort from another thread also
    interrupts the main thread, so the error is raised wherever it works (a generation, a
    grader, a step) rather than at its next step or commit.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""
        self.error: BaseException | None = None
        self._wake: int | None = None  # the main thread, while stop_on_sigterm handles SIGTERM
        self._wake_lock = threading.Lock()

    def request(self, reason: str) -> None:
        self.reason = reason
        self._event.set()

    def abort(self, error: BaseException) -> None:
        self.error = error
        self.request(str(error))
        with self._wake_lock:  # `interrupting` ends (and the handler goes) only after this
            if self._wake is not None and self._wake != threading.get_ident():
                signal.pthread_kill(self._wake, signal.SIGTERM)  # its handler raises `error`

    @contextmanager
    def interrupting(self) -> Iterator[None]:
        """Within the block, an abort from another thread interrupts the calling thread with
        SIGTERM, whose handler must raise the abort (`stop_on_sigterm`'s does)."""
        with self._wake_lock:
            self._wake = threading.get_ident()
        try:
            yield
        finally:
            with self._wake_lock:
                self._wake = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def raise_if_aborted(self) -> None:
        if self.error is not None:
            raise self.error


# What a session needs beyond a training stage's save margin to take one step: start-up (the
# Prefect server, the base model, data) and the first step's compilation. A budget below the
# largest save margin plus this stops every session at step 0: refused before compute.
STARTUP_AND_STEP_SECONDS = 60.0

ABORT_EXIT_CODE = 130  # what a shell reports for a job ended by Ctrl-C


def abort_now() -> NoReturn:
    """A second Ctrl-C: leave at once, from wherever the main thread is (a KeyboardInterrupt
    raised inside a compiled step, an Orbax save or a thread join could be swallowed or wait
    on threads: measured, a run that hung 300 s). Nothing is lost that a kill -9 would keep:
    records are written last, Orbax commits atomically, and the lease of a pid that is gone
    is taken over at once on this host."""
    logging.shutdown()
    os.write(
        2,
        b"far: aborted by Ctrl-C without saving the steps after the last checkpoint; "
        b"run the same command again to continue from there\n",
    )
    os._exit(ABORT_EXIT_CODE)


@contextmanager
def stop_on_sigterm(flag: StopFlag) -> Iterator[StopFlag]:
    """Within the block, SIGTERM (a TPU VM's preemption notice) requests a clean stop, and so
    does a first Ctrl-C (SIGINT): training saves and the run stops, to be continued by the same
    command. A second Ctrl-C leaves at once with exit code 130 (an abort, no save). An abort
    from another thread (the lease's heartbeat found the lease taken over, a background write
    failed) interrupts the main thread, which raises it where it is."""

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        flag.raise_if_aborted()  # an abort (a lost lease, a failed write): leave where we are
        flag.request(f"received signal {signal.Signals(signum).name}")

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        flag.raise_if_aborted()
        if flag.is_set():
            abort_now()
        # the flag first: Python runs a second Ctrl-C's handler inside this one when it comes
        # at once, and that handler must see the first
        flag.request("received signal SIGINT (Ctrl-C)")
        log.warning(
            "Ctrl-C: saving and stopping after the current step (press Ctrl-C again to abort "
            "without saving)"
        )

    previous_term = signal.signal(signal.SIGTERM, on_sigterm)
    previous_int = signal.signal(signal.SIGINT, on_sigint)
    previous_hook = threading.excepthook
    threading.excepthook = _abort_on_failed_write(flag, previous_hook)
    try:
        with flag.interrupting():
            yield flag
    finally:
        threading.excepthook = previous_hook
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def _abort_on_failed_write(
    flag: StopFlag, previous: Callable[[threading.ExceptHookArgs], Any]
) -> Callable[[threading.ExceptHookArgs], Any]:
    """A thread hook: a background thread that died on a write storage refused (TensorBoard's
    event writer on a full disk) aborts the session, which wakes the main thread with SIGTERM,
    whose handler raises the abort. (The main thread may be waiting on that dead thread for
    ever: measured, a put on its full queue at 0% CPU.) Any other thread death is reported as
    before."""

    def hook(args: threading.ExceptHookArgs) -> None:
        if isinstance(args.exc_value, LeaseLost):  # a fenced background write: stop at once
            if flag.error is None:
                flag.abort(args.exc_value)
            return
        cause = None if args.exc_value is None else storage.write_failure(args.exc_value)
        if cause is None or flag.error is not None:
            previous(args)
            return
        name = args.thread.name if args.thread is not None else "a thread"
        flag.abort(SaveFailed(f"a background write ({name}) failed: {cause}"))

    return hook


@dataclass
class StepClock:
    """When each batch was handed out: the basis for step-time estimates and tokens/s."""

    times: list[float] = field(default_factory=list)

    def step_seconds(self) -> float:
        """The slowest of the last few steps (conservative), 0 before two batches."""
        recent = [b - a for a, b in itertools.pairwise(self.times[-6:])]  # the last five
        return max(recent, default=0.0)


def guarded(
    items: Iterator[T],
    deadline: float | None,
    flag: StopFlag | None,
    save_margin_s: float,
    clock: StepClock,
    items_per_step: int = 1,
    health: Callable[[], None] | None = None,
) -> Iterator[T]:
    """`items` until a stop is requested or the deadline is too close for another step.

    `health`, called before every window, raises when a background save failed (Orbax's
    async checkpoint on a full disk), so the session ends there instead of training on
    towards a save that can never succeed.

    With gradient accumulation (`items_per_step` micro-batches per optimizer update) it stops
    only between whole windows: a stop requested inside one takes effect once the window's
    update is done. (Stopped inside a window, Tunix's trainer saves its optimizer state with
    the window's gradients half accumulated, labelled with the last whole update; a resume
    then re-reads those micro-batches from the window start and accumulates them twice.)

    With several JAX processes (multi-host) every step is a collective, so they must stop at
    the same step: at each window boundary, the processes agree (one stops, all stop).
    """
    for handed_out, item in enumerate(items):
        now = time.time()
        window_start = handed_out % items_per_step == 0
        if window_start and health is not None:
            health()
        if window_start and any_process(
            _should_stop(now, deadline, flag, save_margin_s, clock, items_per_step)
        ):
            return
        clock.times.append(now)
        yield item


def nonempty(items: Iterator[T]) -> Iterator[T] | None:
    """`items` unchanged, or None when it yields nothing: a session resumed with no time left
    for one step. (Tunix's RL learner reads a first batch before its loop and fails on none.)"""
    first = next(items, _NOTHING)
    if first is _NOTHING:
        return None
    return itertools.chain([first], items)  # type: ignore[list-item]


_NOTHING = object()


def _should_stop(
    now: float,
    deadline: float | None,
    flag: StopFlag | None,
    save_margin_s: float,
    clock: StepClock,
    items_per_step: int = 1,
) -> bool:
    if flag is not None and flag.is_set():
        flag.raise_if_aborted()
        log.warning("stopping training: %s", flag.reason)
        return True
    needed = clock.step_seconds() * items_per_step + save_margin_s  # one more whole window
    if deadline is not None and deadline - now < needed:
        log.warning("stopping training: %.0f s left before the session deadline", deadline - now)
        return True
    return False


def any_process(local: bool) -> bool:
    """True if `local` is true in any of the run's JAX processes (just `local` in one)."""
    import jax  # deferred: single-process callers pay nothing more

    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils

    return bool(multihost_utils.process_allgather(np.array(local)).any())
