"""pytest-xdist scheduling by a group function of the node id (tests/conftest.py's
`xdist_group`: one group per test file, the files sharing the session's flow runs together).

xdist's `--dist loadgroup` takes groups from `xdist_group` marks by appending them to node ids
in the workers; pytest 9.2 ignores that rewrite (pytest-dev/pytest-xdist#1386), so the marks
did nothing and every test was its own unit. The controller sees only node ids, so the group
is computed from the node id here, the way xdist's own `loadfile` scheduling does (a subclass
of its scope scheduler with `_split_scope` replaced). tests/unit/test_xdist_groups.py runs a
real two-worker session to check that each group stays on one worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling


class GroupScheduling(LoadScopeScheduling):
    """Whole groups to one worker at a time, in collection order (with --no-loadscope-reorder)."""

    def __init__(self, config: pytest.Config, log: Any, group: Callable[[str], str]) -> None:
        super().__init__(config, log)
        self._group = group

    def _split_scope(self, nodeid: str) -> str:
        return self._group(nodeid)
