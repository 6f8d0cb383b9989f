"""A training stream stops only between whole gradient-accumulation windows."""

from __future__ import annotations

import time

import pytest

from stages.core.sessions import StepClock, StopFlag, guarded


class RequestAt(StopFlag):
    """A stop requested when the `at`-th check is made (each handed-out item is one)."""

    def __init__(self, source: list[int], at: int) -> None:
        super().__init__()
        self.source, self.at = source, at

    def is_set(self) -> bool:
        if len(self.source) >= self.at:
            self.request("test")
        return super().is_set()


def handed_out(total: int, per_step: int, stop_after: int) -> list[int]:
    out: list[int] = []
    flag = RequestAt(out, stop_after)
    for item in guarded(iter(range(total)), None, flag, 0.0, StepClock(), per_step):
        out.append(item)
    return out


@pytest.mark.parametrize(
    ("per_step", "stop_after", "expected"),
    [
        (1, 11, 11),  # no accumulation: stops at once
        (8, 11, 16),  # inside the second window: that window is finished first
        (8, 16, 16),  # at a window boundary: stops there
        (8, 0, 0),  # before anything: nothing handed out
        (4, 5, 8),
    ],
)
def test_a_stop_takes_effect_at_the_next_window_boundary(
    per_step: int, stop_after: int, expected: int
) -> None:
    assert handed_out(40, per_step, stop_after) == list(range(expected))


def test_the_deadline_leaves_room_for_a_whole_window() -> None:
    clock = StepClock(times=[0.0, 1.0, 2.0])  # 1 s per micro-batch so far
    now = time.time()
    # 5 s left: enough for one micro-batch, not for a window of 8
    assert list(guarded(iter(range(3)), now + 5.0, None, 0.0, clock, 8)) == []
    clock = StepClock(times=[0.0, 1.0, 2.0])
    assert len(list(guarded(iter(range(3)), now + 5.0, None, 0.0, clock, 1))) >= 1


def test_the_step_time_estimate_starts_with_the_second_batch() -> None:
    assert StepClock(times=[5.0]).step_seconds() == 0.0
    assert StepClock(times=[0.0, 1.0, 3.0]).step_seconds() == 2.0  # the slowest so far
    assert StepClock(times=[0.0, 9.0, 10, 11, 12, 13, 14]).step_seconds() == 1.0  # last five
