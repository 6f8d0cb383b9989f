"""A user's reward, called the way the user wrote it and kept from harming the run.

A user's reward takes one of two forms, told apart by its signature when it is registered:

- per completion, `f(completion, ref) -> float` (two positional parameters, no `**kwargs`);
- batch, TRL's `f(prompts, completions, **columns) -> list[float | None]` (it has a
  `**kwargs` parameter). It is called with keywords only, as TRL calls it, so
  `f(completions, **kwargs)` fits too. `None` means "not applicable" to that completion.

Anything else is refused when the module registers it (`far validate` exits 2), naming both
forms. Every call runs in a thread of its own that the caller waits on in short slices, so a
reward that blocks stops the stage (RewardFailed, exit 2) after `CallLimit.seconds`, and the
session's deadline or a stop request (SIGTERM) ends the wait (SessionExpired) instead of
hanging behind it. `sys.exit` inside a reward is a reward error like any exception, and so
is `os._exit`: while a reward runs, `os._exit` called from the reward's own thread (in this
process) raises in that thread instead of ending the process, so a run never ends with exit 0
because a reward said so (`exit_guard`).
"""

from __future__ import annotations

import inspect
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Real
from typing import Any, Literal, NoReturn

from stages.core.errors import InputError
from stages.core.runner import SessionExpired
from stages.core.sessions import StopFlag

Form = Literal["completion", "batch"]
FORMS = (
    "per completion `f(completion, ref) -> float`, or batch (TRL's) "
    "`f(prompts, completions, **columns) -> list[float | None]`"
)
SLICE_SECONDS = 0.1  # how often a wait looks at the deadline and the stop flag
STOP_GRACE_SECONDS = 5.0  # a reward still running this long after a stop request is left


class RewardFailed(InputError):
    """A user's reward raised, blocked, exited, or returned something other than one finite
    number (or, batch form, None) per completion: the reward module must be fixed (FAR's own
    never do)."""


class BadRewardSignature(InputError):
    """A function registered as a reward fits neither form FAR calls."""


@dataclass(frozen=True)
class CallLimit:
    """How long one call of a user's reward may take: `seconds` (the recipe's
    sandbox.reward_call_seconds), and never past the session's `deadline` (time.time()) or a
    `stop` request."""

    seconds: float = 120.0
    deadline: float | None = None
    stop: StopFlag | None = None


def form_of(name: str, fn: Callable[..., Any]) -> Form:
    """Which form `fn` is written in; BadRewardSignature names both when it is neither."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        params = list(signature.parameters.values())
        if any(p.kind is p.VAR_KEYWORD for p in params):
            if not any(p.kind is p.POSITIONAL_ONLY and p.default is p.empty for p in params):
                return "batch"
        elif _binds(signature, "completion", "ref"):
            return "completion"
    shown = f"{getattr(fn, '__name__', type(fn).__name__)}{signature or '(?)'}"
    raise BadRewardSignature(
        f"reward {name!r} ({getattr(fn, '__module__', '?')}): {shown} fits neither form FAR "
        f"calls; expected {FORMS} (a batch reward is told by its **kwargs)"
    )


def _binds(signature: inspect.Signature, *args: str) -> bool:
    try:
        signature.bind(*args)
    except TypeError:
        return False
    return True


class ExitInReward(BaseException):
    """`os._exit(code)` called by a reward: raised in the reward's thread instead."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class _ExitGuard:
    """`os._exit` while rewards run: the threads running a reward, and the original."""

    original: Any  # os._exit as it was
    pid: int
    threads: set[int]
    users: int = 0


_EXIT_GUARD_LOCK = threading.Lock()
_exit_guard: _ExitGuard | None = None  # installed while at least one reward call runs


def _guarded_exit(status: int) -> NoReturn:
    guard = _exit_guard
    if guard is not None and os.getpid() == guard.pid and threading.get_ident() in guard.threads:
        raise ExitInReward(status)
    (guard.original if guard is not None else os._exit)(status)
    raise AssertionError("os._exit returned")  # pragma: no cover


@contextmanager
def exit_guard(thread: threading.Thread) -> Iterator[None]:
    """`os._exit` from `thread` (in this process) raises ExitInReward while the block runs;
    from any other thread, or a child process forked by the reward, it exits as it would.
    Overlapping calls share one install; the last to leave puts `os._exit` back."""
    global _exit_guard
    with _EXIT_GUARD_LOCK:
        if _exit_guard is None:
            _exit_guard = _ExitGuard(os._exit, os.getpid(), set())
            os._exit = _guarded_exit
        _exit_guard.users += 1
    try:
        yield
    finally:
        with _EXIT_GUARD_LOCK:
            if thread.ident is not None:
                _exit_guard.threads.discard(thread.ident)
            _exit_guard.users -= 1
            if _exit_guard.users == 0:
                os._exit = _exit_guard.original
                _exit_guard = None


def call_within(name: str, module: str, call: Callable[[], Any], limit: CallLimit) -> Any:
    """`call()` in a thread of its own, waited on within `limit`; whatever it raises (SystemExit
    too) is a RewardFailed naming the reward."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            _in_reward(threading.get_ident())  # before the reward's first line
            box["value"] = call()
        except BaseException as error:  # sys.exit in a reward is the reward's error too
            box["error"] = error

    worker = threading.Thread(target=target, name=f"reward {name}", daemon=True)
    with exit_guard(worker):
        return _wait(name, module, worker, box, limit)


def _in_reward(ident: int) -> None:
    """Mark the calling thread as a reward's, for the exit guard."""
    with _EXIT_GUARD_LOCK:
        if _exit_guard is not None:
            _exit_guard.threads.add(ident)


def _wait(
    name: str, module: str, worker: threading.Thread, box: dict[str, Any], limit: CallLimit
) -> Any:
    """Start `worker` (it registers with the exit guard) and wait for it within `limit`."""
    started = time.monotonic()
    worker.start()
    stopped_at: float | None = None
    while worker.is_alive():
        worker.join(SLICE_SECONDS)
        if not worker.is_alive():
            break
        now = time.monotonic()
        if now - started >= limit.seconds:
            raise RewardFailed(
                f"reward {name!r} ({module}) did not return within {limit.seconds:g} s "
                f"(sandbox.reward_call_seconds); a reward must not block: fix it, or raise "
                f"the limit if it is only slow"
            )
        if limit.deadline is not None and time.time() >= limit.deadline:
            raise SessionExpired(
                f"the session deadline passed while reward {name!r} ({module}) was running "
                f"({now - started:.0f} s); the same command continues from the last checkpoint"
            )
        if limit.stop is not None and limit.stop.is_set():
            limit.stop.raise_if_aborted()
            stopped_at = stopped_at if stopped_at is not None else now
            if now - stopped_at >= STOP_GRACE_SECONDS:
                raise SessionExpired(
                    f"{limit.stop.reason} while reward {name!r} ({module}) was running "
                    f"({now - started:.0f} s); the same command continues from the last "
                    f"checkpoint"
                )
    if "error" in box:
        error = box["error"]
        what = f"raised {type(error).__name__}: {error}"
        if isinstance(error, SystemExit):
            what = f"called sys.exit({error.code!r})"
        elif isinstance(error, ExitInReward):
            what = f"called os._exit({error.code!r})"
        raise RewardFailed(
            f"reward {name!r} ({module}) {what}; fix the reward (it must return a number for "
            f"any completion, even an empty or garbled one)"
        ) from error
    return box.get("value")


def checked_scores(
    name: str, module: str, got: Any, completions: Sequence[str], allow_none: bool
) -> list[float | None]:
    """`got` as one float (or, `allow_none`, None: not applicable) per completion; a
    RewardFailed naming the reward and the completion (its first 200 characters) otherwise."""
    if not isinstance(got, list | tuple) or len(got) != len(completions):
        size = f" of {len(got)}" if isinstance(got, list | tuple) else ""
        raise RewardFailed(
            f"reward {name!r} ({module}) returned {type(got).__name__}{size} for "
            f"{len(completions)} completions; expected one number per completion"
        )
    expected = "a finite number or None (not applicable)" if allow_none else "a finite number"
    out: list[float | None] = []
    for i, value in enumerate(got):
        if value is None and allow_none:
            out.append(None)
            continue
        if not isinstance(value, Real) or not math.isfinite(value):
            raise RewardFailed(
                f"reward {name!r} ({module}) scored {value!r} for completion {i} "
                f"{completion_text(completions[i])}; expected {expected}"
            )
        out.append(float(value))
    return out


def completion_text(completion: str) -> str:
    """A completion as an error message shows it: its first 200 characters, quoted."""
    text = str(completion)
    return repr(text[:200]) + ("..." if len(text) > 200 else "")
