"""`far run` on a complete run and `far validate` decide from the records alone: no JAX, no
Prefect server, nothing written, so the ledger root a no-op prints is the one before it.

The complete run is a copy of the session's `smoke_twice` run (tests/conftest.py), so what a
test does to it (a session appended, a file altered) never reaches the other tests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from pipeline.plan import plan_run, settled
from stages.core import storage
from tests.conftest import REPO, SMOKE, SmokeRuns

pytestmark = pytest.mark.slow  # the smoke_twice fixture trains (shared with test_smoke_flow)
HEAVY = ("jax", "prefect", "tunix", "flax")
ROOT_LINE = re.compile(r"ledger root (sha256:[0-9a-f]{64})")


def far(home: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """`far ARGV` in a new process from this tree, and the top-level modules it imported
    (Python's own -X importtime list)."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(REPO),
    }
    env.pop("PREFECT_API_URL", None)
    command = [sys.executable, "-X", "importtime", "-m", "flows.cli", *argv]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=home)
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return done, imported


@pytest.fixture()
def complete_root(smoke_twice: SmokeRuns, tmp_path: Path) -> Path:
    """A copy of the complete smoke run, under its own storage root."""
    source = Path(smoke_twice.first.run_uri)
    root = tmp_path / "root"
    shutil.copytree(source, root / source.name)
    return root


def test_a_rerun_of_a_complete_run_imports_no_jax_writes_nothing_and_prints_the_same_root(
    complete_root: Path, tmp_path: Path
) -> None:
    run = complete_root / "smoke"
    before = {p: p.read_bytes() for p in (run / "run.json", run / "ledger.jsonl")}
    roots = []
    for _ in range(2):
        done, imported = far(tmp_path, "run", str(SMOKE), "--root", str(complete_root))
        assert done.returncode == 0, done.stderr[-3000:]
        assert not imported & set(HEAVY), f"imported {imported & set(HEAVY)}"
        assert "skipped (already complete)" in done.stdout
        # the first line says what will run and where, before anything slow
        assert done.stdout.startswith(f"far: run 'smoke' at {complete_root}/smoke: data_prep -> ")
        roots += ROOT_LINE.findall(done.stdout)
    assert len(roots) == 2 and roots[0] == roots[1], roots
    assert json.loads((run / "ledger.jsonl").read_text().splitlines()[-1])["root"] == roots[0]
    assert {p: p.read_bytes() for p in before} == before  # no session recorded, no entry


def test_validate_of_a_complete_run_and_of_a_new_one_imports_no_jax(
    complete_root: Path, tmp_path: Path
) -> None:
    for root in (complete_root, tmp_path / "new-root"):
        done, imported = far(tmp_path, "validate", str(SMOKE), "--root", str(root))
        assert done.returncode == 0, done.stderr[-3000:]
        assert not imported & set(HEAVY), f"{root}: imported {imported & set(HEAVY)}"
    assert not (tmp_path / "new-root").exists()


def test_anything_short_of_a_verified_complete_run_goes_the_runs_own_way(
    complete_root: Path,
) -> None:
    """A changed recipe, an altered checkpoint byte, a session that did not end complete, a
    ledger a key does not vouch for, a rewritten ledger line: the no-op path declines, and the
    stages' own decisions (drift guard, tamper check) answer as before."""
    root = storage.normalize(str(complete_root))
    recipe = plan_run(str(SMOKE), root).recipe
    assert settled(recipe, root) is not None  # the control
    changed = plan_run(str(SMOKE), root, assignments=["sft.max_steps=151"]).recipe
    assert settled(changed, root) is None
    assert settled(recipe, root, key=SecretStr("a key the run was not signed with")) is None

    run = complete_root / "smoke"
    ledger_file = run / "ledger.jsonl"
    kept = ledger_file.read_bytes()
    lines = kept.decode().splitlines()
    entry = json.loads(lines[1])
    entry["sha256"] = "sha256:" + "0" * 64  # a record's entry rewritten: the chain breaks
    ledger_file.write_text("\n".join([lines[0], json.dumps(entry), *lines[2:]]) + "\n")
    assert settled(recipe, root) is None
    ledger_file.write_bytes(kept)

    manifest_file = run / "run.json"
    kept = manifest_file.read_bytes()
    manifest = json.loads(kept)
    manifest["invocations"][-1]["outcome"] = None  # a session that crashed
    manifest_file.write_text(json.dumps(manifest))
    assert settled(recipe, root) is None
    manifest_file.write_bytes(kept)

    checkpoint = next(p for p in sorted(run.glob("sft-*/checkpoints/**/*")) if p.is_file())
    data = bytearray(checkpoint.read_bytes())
    data[-1] ^= 1
    checkpoint.write_bytes(bytes(data))
    assert settled(recipe, root) is None
