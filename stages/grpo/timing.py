"""Where a GRPO step's time goes: rollout, log-probs, rewards, actor update, sync, checkpoint.

GRPO is most of a FAR run's time, and a step is several very different pieces of work. Each
phase's wall time (waiting for its device work to finish, so JAX's asynchronous dispatch does
not move time into the next phase) is buffered into Tunix's per-step metrics as
`far/seconds/<phase>`: TensorBoard and the record's history get it like every other metric.

A phase that runs inside another (a checkpoint save inside the actor update; the sampler's
compiled prefill and decode loop inside the rollout) is counted once: the outer phase gets
its own time minus the inner one's, so a rollout's seconds are rollout + rollout_prefill +
rollout_decode. `totals` also covers the final
checkpoint that Tunix writes after the last step's metrics were logged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax

from stages.grpo import metrics
from stages.modeling import tunix_compat

PREFIX = metrics.SECONDS_PREFIX
PHASES = (
    "rollout",  # the sampler's host work: tokenizing, padding, detokenizing
    "rollout_prefill",  # nested in rollout: the compiled prompt pass
    "rollout_decode",  # nested in rollout: the compiled decode loop
    "reference_logps",
    "old_logps",
    "rewards",
    "actor_update",
    "weight_sync",
    "checkpoint_save",
)

Emit = Callable[[dict[str, tuple[float, Any]]], None]


class PhaseTimer:
    """Times wrapped calls by phase and emits each one's seconds as a step metric."""

    def __init__(self, emit: Emit, clock: Callable[[], float] = time.perf_counter) -> None:
        self.emit, self.clock = emit, clock
        self.totals: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._inner: list[float] = []  # per open phase: seconds spent in phases nested in it

    def wrap(
        self,
        phase: str,
        fn: Callable[..., Any],
        settle: Callable[[Any], Any] | None = None,
        before: Callable[[], Any] | None = None,
    ) -> Callable[..., Any]:
        """`fn`, timed as `phase`; `settle(result)` waits for its device work (default: the
        result's arrays). `before()` runs first, untimed here, so its seconds stay with the
        enclosing phase: a checkpoint save first waits for the training step still running
        (JAX dispatches asynchronously), and that wait is the update's time, not the save's."""
        if phase not in self.totals:
            raise ValueError(f"unknown GRPO phase {phase!r}; expected one of {PHASES}")
        wait = settle or jax.block_until_ready

        def timed(*args: Any, **kwargs: Any) -> Any:
            if before is not None:
                before()
            start = self.clock()
            self._inner.append(0.0)
            try:
                result = fn(*args, **kwargs)
                wait(result)
            finally:
                nested = self._inner.pop()
                elapsed = self.clock() - start
                if self._inner:
                    self._inner[-1] += elapsed
                self._record(phase, elapsed - nested)
            return result

        return timed

    def _record(self, phase: str, seconds: float) -> None:
        self.totals[phase] += seconds
        self.emit({PREFIX + phase: (seconds, sum)})


def instrument(cluster: Any, learner: Any) -> PhaseTimer:
    """Time `cluster`'s and `learner`'s GRPO phases from now on, as step metrics of `cluster`."""
    timer = PhaseTimer(lambda metrics: cluster.buffer_metrics(metrics))
    tunix_compat.wrap_grpo_phases(cluster, learner, timer.wrap)
    return timer


def step_seconds(curves: dict[str, list[float]]) -> dict[str, float]:
    """Mean seconds per step of each timed phase, from the record's history."""
    return {
        name.removeprefix(PREFIX): sum(values) / len(values)
        for name, values in curves.items()
        if name.startswith(PREFIX) and values
    }
