"""Objects built once per run and process, then lent to every stage of the run.

Building the base network (reading and placing its weights) and the tokenizer is the same
work for every stage and every evaluated model of a run. The run's entry point creates one
`SharedBuilds` and carries it in RunContext; stages ask it for those objects instead of
building their own. It is a plain object, not a module-level cache: a run without one
(RunContext.shared is None) builds everything where it is used, as before.

What it hands out is shared: a stage must never change it. Stages train LoRA clones on top
of a shared base network, and build a private network when they change the weights
themselves (full-weight training or a full-weight checkpoint restore).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class SharedBuilds:
    """A memo of expensive, read-only objects keyed by what determines them.

    `builds` counts how many times each kind was built (once per distinct key).
    """

    def __init__(self) -> None:
        self._values: dict[tuple[str, Hashable], Any] = {}
        self._lock = threading.Lock()
        self.builds: Counter[str] = Counter()

    def get(self, kind: str, key: Hashable, build: Callable[[], T]) -> T:
        """The object of `kind` for `key`, built by `build` the first time it is asked for."""
        with self._lock:  # one build per key even if two stages ask at once
            slot = (kind, key)
            if slot not in self._values:
                self._values[slot] = build()
                self.builds[kind] += 1
            value: T = self._values[slot]
            return value

    def __repr__(self) -> str:  # Prefect logs task parameters: no weights in the log
        return f"SharedBuilds({dict(self.builds)})"
