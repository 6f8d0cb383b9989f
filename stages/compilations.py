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
        _unregister(counter)


def _unregister(counter: CompileCounter) -> None:
    try:
        jax.monitoring.unregister_event_duration_listener(counter)  # type: ignore[arg-type]
    except AssertionError:
        # Tunix's MetricsLogger.close() (end of PeftTrainer.train) clears every JAX
        # listener, ours included; by then training, and so the counting, is over.
        return


def release_scalar_listeners(metrics_logger: Any) -> int:
    """Detach a closed Tunix MetricsLogger's backends from jax.monitoring; how many were left.

    Tunix registers each backend's log_scalar as a JAX scalar listener and, on close, relies on
    jax.monitoring.clear_event_listeners(), which in JAX 0.10.2 does not clear scalar
    listeners (it assigns a local `_scalar_listeners`). The closed TensorBoard backend then
    reopens a file in the finished stage's directory and receives every later stage's
    scalars. Call this after training so a committed stage directory stays as recorded.
    """
    released = 0
    for backend in getattr(metrics_logger, "_backends", []):
        try:
            jax.monitoring.unregister_scalar_listener(backend.log_scalar)
        except AssertionError:  # not registered (process index > 0, or already released)
            continue
        released += 1
    return released
