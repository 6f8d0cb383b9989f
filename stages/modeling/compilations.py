"""Counting XLA compilations of a named function, through JAX's public monitoring events.

A recompiled train step is a silent tax on TPU (minutes per compile on big models): SFT and
GRPO record how many times their train step compiled in the session (GRPO also its rollout
sampler), the evaluation how many times its sampler compiled per model; the goal is exactly
one each per session, a resumed session included. A compilation served from JAX's persistent
cache counts too (JAX reports both as one backend compile event): it is one executable built.

Names are those of the jitted Python functions: Tunix's trainers (SFT's PeftTrainer and the
RL actor trainer alike) jit `_train_step`; its Sampler jits `_prefill_fn` and `_decode_fn`.
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
        return self.count_of(self.name_fragment)

    def count_of(self, fragment: str) -> int:
        """Compilations seen of functions whose name contains `fragment`."""
        return sum(fragment in name for name in self.names)

    def __call__(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == BACKEND_COMPILE_EVENT:
            self.names.append(str(kwargs.get("fun_name", "")))


@contextmanager
def counting_compilations(name_fragment: str = "") -> Iterator[CompileCounter]:
    """Within the block, count backend compilations of functions whose name contains it
    (`count`); `count_of(other)` counts those of other names seen in the block."""
    counter = CompileCounter(name_fragment)
    jax.monitoring.register_event_duration_secs_listener(counter)  # type: ignore[arg-type]
    try:
        yield counter
    finally:
        tunix_compat.unregister_duration_listener(counter)


TRAIN_STEP = "_train_step"
SAMPLER_FUNCTIONS = {"prefill": "_prefill_fn", "decode": "_decode_fn"}
