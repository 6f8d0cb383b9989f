"""JAX's persistent compilation cache across processes: a second process finds the first's
executables (cache hits, fewer misses) and trains to the same weights, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def train_in_a_new_process(root: Path, cache: Path) -> dict[str, Any]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration._compile_cache_child", str(root), str(cache)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    return dict(json.loads(line.removeprefix("RESULT ")))


def test_a_second_process_hits_the_cache_and_trains_the_same(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = train_in_a_new_process(tmp_path / "first", cache)
    second = train_in_a_new_process(tmp_path / "second", cache)
    # an empty cache: the first process compiles (its hits are computations it compiled
    # earlier itself, e.g. the same sampler step for another model instance)
    assert first["misses"] > 0
    assert second["misses"] < first["misses"] and second["hits"] > first["hits"], (first, second)
    assert second["lora_sha256"] == first["lora_sha256"]
    assert second["final_loss"] == first["final_loss"]
    # keyed by the JAX/jaxlib versions and the device kind, under the configured root
    directory = Path(first["directory"])
    assert directory.parent == cache / "xla" and jax.__version__ in directory.name
    assert second["directory"] == first["directory"]
    assert any(directory.iterdir())
