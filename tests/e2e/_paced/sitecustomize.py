"""Test-only pacing for a `far` child: on PYTHONPATH, Python imports this module at start-up,
before `far` imports the stages. With FAR_TEST_STEP_PACE_S set, every training batch the
session hands its trainer (stages.core.sessions.guarded) comes that many seconds late, asleep:
the session's clock runs as on a much slower machine while its CPU idles, so a session budget
falls inside training with a few steps instead of many busy ones.

tests/e2e/test_deployment.py puts this folder on the first Kaggle session's PYTHONPATH only.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator
from typing import Any

PACE_ENV = "FAR_TEST_STEP_PACE_S"


def _paced(guarded: Any, pace_s: float) -> Any:
    """`guarded` whose every item waits `pace_s` seconds before the stop check sees it."""

    @functools.wraps(guarded)
    def paced(items: Iterator[Any], *args: Any, **kwargs: Any) -> Iterator[Any]:
        def slow() -> Iterator[Any]:
            for item in items:
                time.sleep(pace_s)
                yield item

        return guarded(slow(), *args, **kwargs)  # type: ignore[no-any-return]

    return paced


def _install() -> None:
    pace = os.environ.get(PACE_ENV)
    if not pace:
        return
    from stages.core import sessions

    sessions.guarded = _paced(sessions.guarded, float(pace))  # type: ignore[method-assign]


_install()
