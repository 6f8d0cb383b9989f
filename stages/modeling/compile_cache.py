"""JAX's persistent compilation cache, so a restarted session skips XLA compilation.

A TPU VM that resumes every few hours, or a preempted one, otherwise compiles every train,
rollout and sampling step again at each start. JAX can keep compiled executables in a
directory (local, or gs:// through etils.epath and gcsfs) and load them instead of compiling.

The entry point (flows/, a bench script, the test session) calls `enable` once per process,
before the first compilation. JAX's own cache key already covers the JAX version, the XLA
backend, the devices and the compile options; the executables still go into a subdirectory
named by the JAX/jaxlib versions and the device kind, so caches of different installs or
hardware never share a directory and an upgrade is one `rm -r` away.

JAX only reads its cache directory at the first compilation that uses it; switching it later
in the same process has no effect, so `enable` keeps a directory already set and says so.

The cache is trusted code: whoever can write into it can make this process run an executable
of their choosing. Point it only at a directory (or bucket) that this run alone writes to.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jax
import jaxlib

log = logging.getLogger(__name__)
SUBDIR_PREFIX = "xla"
HITS_EVENT = "/jax/compilation_cache/cache_hits"
MISSES_EVENT = "/jax/compilation_cache/cache_misses"
SAVED_EVENT = "/jax/compilation_cache/compile_time_saved_sec"
# Cache every compilation, not only those over JAX's default 1 s: on a restart the many
# small ones (sampler steps, reshards) add up to a large share of the time to the first step.
MIN_COMPILE_SECONDS = 0.0


def cache_key() -> str:
    """`jax-<v>_jaxlib-<v>_<platform>-<device kind>`, safe as a directory name."""
    device = jax.devices()[0]
    raw = (
        f"jax-{jax.__version__}_jaxlib-{jaxlib.__version__}_{device.platform}-{device.device_kind}"
    )
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw)


def directory_for(root: str) -> str:
    """The versioned subdirectory of `root` (a local path or a gs:// URI) for this process."""
    return f"{root.rstrip('/')}/{SUBDIR_PREFIX}/{cache_key()}"


def enable(root: str) -> str:
    """Use JAX's persistent compilation cache under `root`; the directory JAX now uses.

    If this process already has a cache directory (set by an outer entry point), it is kept.
    """
    current = jax.config.values.get("jax_compilation_cache_dir")
    wanted = directory_for(root)
    if current:
        if current != wanted:
            log.info("compilation cache stays at %s (asked for %s)", current, wanted)
        return str(current)
    jax.config.update("jax_compilation_cache_dir", wanted)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # no size floor
    log.info("persistent compilation cache: %s", wanted)
    return wanted


@dataclass(eq=False)
class CacheStats:
    """Persistent-cache hits and misses, and the compile seconds the hits saved."""

    hits: int = 0
    misses: int = 0
    seconds_saved: float = 0.0
    _listeners: list[Any] = field(default_factory=list, repr=False)

    def on_event(self, event: str, **_: Any) -> None:
        if event == HITS_EVENT:
            self.hits += 1
        elif event == MISSES_EVENT:
            self.misses += 1

    def on_duration(self, event: str, duration: float, **_: Any) -> None:
        if event == SAVED_EVENT:
            self.seconds_saved += duration


@contextmanager
def counting_cache_use() -> Iterator[CacheStats]:
    """Within the block, count persistent-cache hits and misses (JAX monitoring events)."""
    from stages.modeling import tunix_compat  # Tunix may clear JAX listeners; see there

    stats = CacheStats()
    jax.monitoring.register_event_listener(stats.on_event)
    jax.monitoring.register_event_duration_secs_listener(stats.on_duration)  # type: ignore[arg-type]
    try:
        yield stats
    finally:
        tunix_compat.unregister_event_listener(stats.on_event)
        tunix_compat.unregister_duration_listener(stats.on_duration)
