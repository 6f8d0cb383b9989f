"""The GRPO phase timer: each phase's own seconds, nested phases counted once."""

from __future__ import annotations

from typing import Any

import pytest

from stages.grpo import timing


class FakeClock:
    """A clock the test moves by hand (no wall-clock in tests)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_nested_phase_is_subtracted_from_the_outer_one() -> None:
    clock, emitted = FakeClock(), []
    timer = timing.PhaseTimer(emitted.append, clock)

    def save() -> None:
        clock.now += 2.0

    timed_save = timer.wrap("checkpoint_save", save)

    def update() -> None:
        clock.now += 3.0
        timed_save()
        clock.now += 1.0

    timer.wrap("actor_update", update)()
    assert timer.totals["checkpoint_save"] == 2.0
    assert timer.totals["actor_update"] == 4.0  # 6 s in all, 2 of them saving
    names = [next(iter(m)) for m in emitted]
    assert names == ["far/seconds/checkpoint_save", "far/seconds/actor_update"]
    assert emitted[1]["far/seconds/actor_update"][0] == 4.0


def test_the_wait_before_a_save_is_the_enclosing_updates_time() -> None:
    """The save first waits for the training step still running on the device (JAX
    dispatches asynchronously); that wait belongs to the update, not to the save."""
    clock, emitted = FakeClock(), []
    timer = timing.PhaseTimer(emitted.append, clock)

    def pending_training() -> None:
        clock.now += 5.0

    def save() -> None:
        clock.now += 0.5

    timed_save = timer.wrap("checkpoint_save", save, before=pending_training)

    def update() -> None:
        clock.now += 1.0  # dispatching the step
        timed_save()

    timer.wrap("actor_update", update)()
    assert timer.totals["checkpoint_save"] == 0.5
    assert timer.totals["actor_update"] == 6.0


def test_a_failing_phase_is_still_timed_and_raises() -> None:
    clock, emitted = FakeClock(), []
    timer = timing.PhaseTimer(emitted.append, clock)

    def broken() -> Any:
        clock.now += 1.5
        raise RuntimeError("rollout failed")

    with pytest.raises(RuntimeError, match="rollout failed"):
        timer.wrap("rollout", broken)()
    assert timer.totals["rollout"] == 1.5


def test_unknown_phase_is_refused_with_the_valid_ones() -> None:
    timer = timing.PhaseTimer(lambda metrics: None)
    with pytest.raises(ValueError, match=r"unknown GRPO phase 'sampling'.*rollout"):
        timer.wrap("sampling", lambda: None)


def test_step_seconds_averages_each_phase_from_the_history() -> None:
    curves = {"far/seconds/rollout": [1.0, 3.0], "rewards/sum": [0.5, 1.0], "kl": [0.1]}
    assert timing.step_seconds(curves) == {"rollout": 2.0}
