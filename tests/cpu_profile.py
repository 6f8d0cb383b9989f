"""Where a test session's CPU goes, per test phase: FAR_CPU_PROFILE=PATH appends one JSON line
per setup, call and teardown to PATH (off when unset; tests/conftest.py loads this plugin).

Wall time on a shared 2-core machine says little; CPU seconds do. Each row has the phase's
wall seconds, the CPU seconds (user + system) of the pytest process and of the children it
waited for (getrusage(RUSAGE_CHILDREN) counts a child only once it has been waited for, so a
server that outlives a test lands on the phase that stops it), the processes the phase started,
and JAX's compilation work: in this process the backend compilations and their seconds
(which JAX reports for a persistent-cache load too) and the cache hits and misses; in every
process using the session's compilation cache (`compilation_cache`, the tests' helper
children) the executables newly written there, i.e. cold compilations (every compilation is
written: compile_cache sets no time or size floor).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PROFILE_ENV = "FAR_CPU_PROFILE"
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
CACHE_HITS = "/jax/compilation_cache/cache_hits"
CACHE_MISSES = "/jax/compilation_cache/cache_misses"


@dataclass
class _Jax:
    """JAX monitoring counts in this process (re-registered per phase: Tunix's trainers clear
    every listener when they finish)."""

    compiles: int = 0
    compile_s: float = 0.0
    hits: int = 0
    misses: int = 0
    spawned: list[str] = field(default_factory=list)

    def on_duration(self, event: str, duration: float, **_: Any) -> None:
        if event == BACKEND_COMPILE:
            self.compiles += 1
            self.compile_s += duration

    def on_event(self, event: str, **_: Any) -> None:
        if event == CACHE_HITS:
            self.hits += 1
        elif event == CACHE_MISSES:
            self.misses += 1

    def listen(self) -> None:
        import jax

        for unregister, register, listener in (
            (
                jax.monitoring.unregister_event_duration_listener,
                jax.monitoring.register_event_duration_secs_listener,
                self.on_duration,
            ),
            (
                jax.monitoring.unregister_event_listener,
                jax.monitoring.register_event_listener,
                self.on_event,
            ),
        ):
            with contextlib.suppress(AssertionError):  # not registered, or cleared by Tunix
                unregister(listener)
            register(listener)  # type: ignore[operator]

    def snapshot(self) -> tuple[int, float, int, int, int]:
        return (self.compiles, self.compile_s, self.hits, self.misses, len(self.spawned))


_JAX = _Jax()


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _cache_entries() -> int:
    root = os.environ.get("FAR_TEST_COMPILE_CACHE")
    if not root:
        return 0
    return sum(len(files) for _, _, files in os.walk(root))


def _record(item: pytest.Item, phase: str) -> Iterator[None]:
    path = os.environ.get(PROFILE_ENV)
    if not path:
        yield
        return
    _JAX.listen()
    before = (time.monotonic(), *_cpu(), _cache_entries(), *_JAX.snapshot())
    yield
    after = (time.monotonic(), *_cpu(), _cache_entries(), *_JAX.snapshot())
    d = [round(a - b, 2) for a, b in zip(after, before, strict=True)]
    row = {
        "test": item.nodeid,
        "phase": phase,
        "wall_s": d[0],
        "cpu_self_s": d[1],
        "cpu_children_s": d[2],
        "session_cache_new_entries": int(d[3]),
        "compiles_here": int(d[4]),
        "compile_s_here": d[5],
        "cache_hits_here": int(d[6]),
        "cache_misses_here": int(d[7]),
        "spawned": _JAX.spawned[int(before[-1]) :],
        "load1": round(os.getloadavg()[0], 2),
    }
    with open(path, "a") as out:
        out.write(json.dumps(row) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _record(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _record(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _record(item, "teardown")


def pytest_configure(config: pytest.Config) -> None:
    """Name each process a test starts (argv's first words), to count imports paid again."""
    if not os.environ.get(PROFILE_ENV):
        return
    original = subprocess.Popen.__init__

    def counting_init(self: subprocess.Popen[Any], args: Any, *a: Any, **k: Any) -> None:
        words = [args] if isinstance(args, str | os.PathLike) else list(args)
        _JAX.spawned.append(" ".join(Path(str(w)).name for w in words[:4]))
        original(self, args, *a, **k)

    subprocess.Popen.__init__ = counting_init  # type: ignore[method-assign]
