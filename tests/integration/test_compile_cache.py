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


COMPILE_ONE = """
import sys, jax, jax.numpy as jnp
from stages.modeling import compile_cache
directory = compile_cache.enable(sys.argv[1])
with compile_cache.counting_cache_use() as stats:
    jax.jit(lambda x: jnp.sin(x) * 2 + 1)(jnp.ones(8)).block_until_ready()
print("RESULT", directory, stats.hits, stats.misses)
"""


@pytest.mark.gcs
def test_the_cache_works_on_gcs(fake_gcs: str) -> None:
    """Through the real GCS JSON API (fake-gcs-server): JAX writes and reads the cache with
    etils.epath on gcsfs, so a TPU VM that is recreated finds its executables in a bucket."""
    root = f"gs://{fake_gcs}/xla-cache"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    results = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", COMPILE_ONE, root],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        results.append(line.split())
    (_, directory, hits1, misses1), (_, _, hits2, misses2) = results
    assert directory.startswith(f"{root}/xla/jax-")
    assert int(misses1) > 0 and int(hits1) == 0
    assert int(hits2) == int(misses1) and int(misses2) == 0
