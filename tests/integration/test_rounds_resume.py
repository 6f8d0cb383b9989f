"""recipes/smoke-rounds.yaml, two rounds of select -> train as one DAG (headroom -> hard ->
grpo -> headroom2 -> hard2 -> grpo2), killed with SIGKILL inside each node in turn, resumes to
the very result of an uninterrupted run: the same datasets, the same evaluation rows and
completions, and the same LoRA weights bit for bit.

Each run is a child process (tests/integration/_rounds_child.py) running the DAG's nodes as
the flow's tasks do, without Prefect: one uninterrupted, then one killed inside each node
(each resuming what the one before it left), then one that finishes. A training node dies
past a saved checkpoint; a node that checks its stop flag fewer times dies right after it
returns, its record committed and the next node not begun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.dag import build_dag
from pipeline.recipes import load_recipe
from schemas.artifacts import CheckpointArtifact, DatasetArtifact, EvalReport
from schemas.record import StageRecord
from stages.core import storage
from tests.conftest import REPO
from tests.integration.test_sft_full import lora_leaves

pytestmark = pytest.mark.slow
RECIPE = REPO / "recipes" / "smoke-rounds.yaml"
TRAINING = ("sft", "grpo", "grpo2")


def run_child(root: Path, kill: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    args = [sys.executable, "-m", "tests.integration._rounds_child", str(RECIPE), str(root)]
    return subprocess.run(
        args + ([kill] if kill else []),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def outputs(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def record(root: Path, node: str) -> StageRecord | None:
    found = list((root / "smoke-rounds").glob(f"{node}-*/stage.json"))
    return StageRecord.model_validate(storage.read_json(str(found[0]))) if found else None


def samples(report: EvalReport) -> list[tuple[Any, ...]]:
    rows = [json.loads(line) for line in storage.read_text(report.samples_uri).splitlines()]
    return sorted((r["model"], r["id"], r["completion"], r["correct"]) for r in rows)


def test_two_rounds_resume_after_kill_9_inside_each_node(tmp_path: Path) -> None:
    reference = outputs(run_child(tmp_path / "straight"))
    nodes = [n.id for n in build_dag(load_recipe(str(RECIPE), {}, ())).nodes]
    assert list(reference) == nodes
    killed_root = tmp_path / "killed"
    for node in nodes:
        killed = run_child(killed_root, node)
        said = killed.stdout + killed.stderr
        assert killed.returncode == -signal.SIGKILL, said[-3000:]
        assert f"KILLING MYSELF inside {node}" in said or f"after {node} returned" in said
        if node in TRAINING:  # mid-stage: uncommitted, a checkpoint saved to resume from
            assert f"KILLING MYSELF inside {node}" in said, said[-3000:]
            assert record(killed_root, node) is None
    resumed = outputs(run_child(killed_root))
    for node in TRAINING:
        found = record(killed_root, node)
        assert found is not None and [s.outcome for s in found.sessions][-1] == "complete"
        assert found.metrics["resumed_from_step"] > 0, node  # it continued a saved step
    for node in nodes:
        want, got = (record(root, node) for root in (tmp_path / "straight", killed_root))
        assert want is not None and got is not None
        if isinstance(want.output, DatasetArtifact):
            assert got.output.fingerprint == want.output.fingerprint, node  # type: ignore[union-attr]
        elif isinstance(want.output, EvalReport):
            assert samples(got.output) == samples(want.output), node  # type: ignore[arg-type]
        else:
            assert isinstance(want.output, CheckpointArtifact), node
            pairs = zip(lora_leaves(got.output), lora_leaves(want.output), strict=True)  # type: ignore[arg-type]
            assert all((a == b).all() for a, b in pairs), node
    assert set(resumed) == set(reference)
