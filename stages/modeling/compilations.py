"""Counting XLA compilations of a named function, through JAX's public monitoring events.

A recompiled train step is a silent tax on TPU (minutes per compile on big models); the SFT
stage records how many times its train step compiled (the goal is exactly one per run).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jax

from stages.modeling import tunix_compat

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclass(eq=False)
class CompileCounter:
    name_fragment: str
    names: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(self.name_fragment in name for name in self.names)

    def __call__(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == BACKEND_COMPILE_EVENT:
            self.names.append(str(kwargs.get("fun_name", "")))


@contextmanager
def counting_compilations(name_fragment: str) -> Iterator[CompileCounter]:
    """Within the block, count backend compilations of functions whose name contains it."""
    counter = CompileCounter(name_fragment)
    jax.monitoring.register_event_duration_secs_listener(counter)  # type: ignore[arg-type]
    try:
        yield counter
    finally:
        tunix_compat.unregister_duration_listener(counter)
