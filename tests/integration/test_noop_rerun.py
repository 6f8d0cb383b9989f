"""`far run` on a complete run and `far validate` decide from the records alone: no JAX, no
Prefect server, nothing written, so the ledger root a no-op prints is the one before it.

Each complete run is a copy of one run made once: the session's `smoke_twice` and `dag_run`
runs (tests/conftest.py: smoke.yaml, and smoke-dag.yaml with its pick node), and this
module's smoke run with a reward of the test's own (a plugin module), so what a test does to
a copy (a session appended, a file altered) never reaches the other tests."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import SecretStr

from pipeline.plan import completed_nodes, plan_run
from schemas.recipe import Recipe
from schemas.record import RunSummary
from stages.core import ledger, storage
from tests.conftest import FAR_COMPILE_CACHE, REPO, SMOKE, SmokeRuns, on_api

pytestmark = pytest.mark.slow  # the smoke_twice fixture trains (shared with test_smoke_flow)
HEAVY = ("jax", "prefect", "tunix", "flax")
ROOT_LINE = re.compile(r"ledger root (sha256:[0-9a-f]{64})")


def far(
    home: Path, *argv: str, path: Sequence[Path] = ()
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """`far ARGV` in a new process from this tree (and the plugin folders `path`), and the
    top-level modules it imported (Python's own -X importtime list)."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join(str(p) for p in (REPO, *path)),
    }
    command = [sys.executable, "-X", "importtime", "-m", "flows.cli", *argv]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=home)
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return done, imported


def tree_digest(run: Path) -> str:
    """One digest of every file under `run`: its path and its bytes."""
    digest = hashlib.sha256()
    for file in sorted(p for p in run.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(run)}\0".encode())
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def copied(run_uri: str, root: Path) -> Path:
    """A copy of the run at `run_uri` under `root`; the copy's run folder."""
    source = Path(run_uri)
    shutil.copytree(source, root / source.name)
    return root / source.name


def rerun_is_a_noop(
    home: Path, argv: Sequence[str], run: Path, root: str, path: Sequence[Path] = ()
) -> None:
    """`far run ARGV` on the complete `run`: the no-op answer, with the ledger root `root`,
    no JAX, and not a byte on storage changed."""
    before = tree_digest(run)
    done, imported = far(home, "run", *argv, "--root", str(run.parent), path=path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Nothing to run" in done.stdout, done.stdout[-3000:]
    assert not imported & set(HEAVY), f"imported {imported & set(HEAVY)}"
    assert ROOT_LINE.findall(done.stdout) == [root]
    assert tree_digest(run) == before


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
    tree = tree_digest(run)
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
    assert tree_digest(run) == tree


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
    assert completed_nodes(recipe, root) is not None  # the control
    changed = plan_run(str(SMOKE), root, assignments=["sft.max_steps=151"]).recipe
    assert completed_nodes(changed, root) is None
    assert completed_nodes(recipe, root, key=SecretStr("a key the run was not signed with")) is None

    run = complete_root / "smoke"
    ledger_file = run / "ledger.jsonl"
    kept = ledger_file.read_bytes()
    lines = kept.decode().splitlines()
    entry = json.loads(lines[1])
    entry["sha256"] = "sha256:" + "0" * 64  # a record's entry rewritten: the chain breaks
    ledger_file.write_text("\n".join([lines[0], json.dumps(entry), *lines[2:]]) + "\n")
    assert completed_nodes(recipe, root) is None
    ledger_file.write_bytes(kept)

    manifest_file = run / "run.json"
    kept = manifest_file.read_bytes()
    manifest = json.loads(kept)
    manifest["invocations"][-1]["outcome"] = None  # a session that crashed
    manifest_file.write_text(json.dumps(manifest))
    assert completed_nodes(recipe, root) is None
    manifest_file.write_bytes(kept)

    checkpoint = next(p for p in sorted(run.glob("sft-*/checkpoints/**/*")) if p.is_file())
    data = bytearray(checkpoint.read_bytes())
    data[-1] ^= 1
    checkpoint.write_bytes(bytes(data))
    assert completed_nodes(recipe, root) is None


def test_a_complete_dag_run_with_a_pick_node_reruns_as_a_noop(
    dag_run: tuple[Recipe, RunSummary], tmp_path: Path
) -> None:
    """smoke-dag.yaml: evaluate_all takes the pick's output, and its record names the chosen
    stage's record (where that checkpoint lies), not the pick's: still the no-op path, and
    `far audit --expect-root` with the root the run printed holds afterwards."""
    _, summary = dag_run
    run = copied(summary.run_uri, tmp_path / "root")
    # the root as copied: other tests of the shared run may have added sessions since
    root = ledger.root(storage.normalize(str(run)))
    assert root is not None
    rerun_is_a_noop(tmp_path, [str(REPO / "recipes" / "smoke-dag.yaml")], run, root)
    done, _ = far(tmp_path, "audit", str(run), "--expect-root", root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


REWARD_MODULE = "noop_reward"
REWARD = '''"""A test's own reward, in a module of its own (a plugin)."""

from stages.rewards import Reference, answer_match, reward


@reward("noop_exact")
def noop_exact(completion: str, ref: Reference) -> float:
    return answer_match(completion, ref)
'''
# smoke.yaml scaled down to the fewest steps, prompts and tokens that still run every stage
# (the skip decision does not depend on what was learnt), with the plugin's reward
SMALL_PLUGIN_RUN = (
    str(SMOKE),
    "--name",
    "plugin-reward",
    "--plugin",
    REWARD_MODULE,
    "grpo.rewards={noop_exact: 1.0}",
    "sft.max_steps=1",
    "sft.checkpoint_every_steps=1",
    "grpo.max_steps=1",
    "grpo.checkpoint_every_steps=1",
    "grpo.batch_size=1",
    "grpo.num_generations=2",
    "grpo.max_generation_tokens=16",
    "eval.max_generation_tokens=16",
    "allow_long_sft_targets=true",  # most smoke targets are longer than 16 tokens
    "eval.models=[grpo]",
    "data.sft.size=8",
    "data.eval.size=2",
    "data.grpo.size=2",
)


@dataclass(frozen=True)
class PluginRun:
    run: Path  # the complete run
    plugin: Path  # the folder holding the reward module
    root: str  # the ledger root its `far run` printed


@pytest.fixture(scope="module")
def plugin_run(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> PluginRun:
    """SMALL_PLUGIN_RUN through `far run` once (on the session's Prefect server)."""
    home = tmp_path_factory.mktemp("plugin-home")
    plugin = tmp_path_factory.mktemp("plugin")
    (plugin / f"{REWARD_MODULE}.py").write_text(REWARD)
    root = home / "root"
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(home),
        "PREFECT_API_URL": prefect_api,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(plugin)]),
        FAR_COMPILE_CACHE: os.environ.get(FAR_COMPILE_CACHE, ""),
    }
    command = [sys.executable, "-m", "flows.cli", "run", *SMALL_PLUGIN_RUN, "--root", str(root)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (printed,) = ROOT_LINE.findall(done.stdout)
    return PluginRun(root / "plugin-reward", plugin, printed)


def test_a_complete_run_with_a_plugin_reward_reruns_as_a_noop(
    plugin_run: PluginRun, tmp_path: Path
) -> None:
    run = copied(str(plugin_run.run), tmp_path / "root")
    rerun_is_a_noop(tmp_path, SMALL_PLUGIN_RUN, run, plugin_run.root, [plugin_run.plugin])


def test_a_changed_reward_file_is_refused_by_its_digest_before_anything_is_written(
    plugin_run: PluginRun, tmp_path: Path
) -> None:
    """The reward module's file changed (one comment): not complete, and refused as the GRPO
    stage's drift guard refuses it, naming both digests, before a session starts; allowed,
    the plan runs GRPO again and decides evaluate after it."""
    run = copied(str(plugin_run.run), tmp_path / "root")
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    changed = REWARD + "# a comment\n"
    (plugin / f"{REWARD_MODULE}.py").write_text(changed)
    old = hashlib.sha256(REWARD.encode()).hexdigest()
    new = hashlib.sha256(changed.encode()).hexdigest()
    before = tree_digest(run)
    argv = [*SMALL_PLUGIN_RUN, "--root", str(run.parent)]
    done, imported = far(tmp_path, "run", *argv, path=[plugin])
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert f'code.rewards.noop_exact: "{old}" -> "{new}"' in done.stderr
    assert "stage grpo differs" in done.stderr
    assert not imported & set(HEAVY), f"imported {imported & set(HEAVY)}"
    assert tree_digest(run) == before

    allowed = ["--allow-change", "code.rewards.noop_exact"]
    done, _ = far(tmp_path, "validate", *argv, *allowed, path=[plugin])
    assert done.returncode == 0, done.stderr[-3000:]
    plan = {line.split()[0]: line.split()[3] for line in done.stdout.splitlines()[2:]}
    assert plan == {"data_prep": "skip", "sft": "skip", "grpo": "run", "evaluate": "depends"}
    assert tree_digest(run) == before


def test_a_scheduled_run_of_a_complete_run_writes_nothing(
    smoke_twice: SmokeRuns, complete_root: Path
) -> None:
    """The deployment's flow (what a schedule runs) takes the same no-op path as `far run`."""
    from flows.deployment import far_scheduled

    run = complete_root / "smoke"
    before = tree_digest(run)
    root = json.loads((run / "ledger.jsonl").read_text().splitlines()[-1])["root"]
    with on_api(smoke_twice.api_url):
        state = far_scheduled(str(SMOKE), str(complete_root), return_state=True)
    summary = state.result()
    assert isinstance(summary, RunSummary)
    assert state.is_completed() and summary.complete
    assert [s.skipped for s in summary.stages] == [True] * 4
    assert summary.ledger_root == root
    assert tree_digest(run) == before
