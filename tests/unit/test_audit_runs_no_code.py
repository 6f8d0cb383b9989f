"""Reading a run never runs code from it: `far audit`, `far status` and `far lineage` treat the
run's storage as data. No module the run names (run.json's `plugins`) is imported, the current
directory is never put on sys.path, and `--plugin MODULE` there checks the caller's copy of a
plugin against the digest the run's records hold, without importing it.

Runs are real `run_stage` calls on small files (tests/unit/test_records.py); the attacks are
what a writer with storage access does, with FAR's own functions.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

import pytest

from flows import cli
from pipeline.dag import build_dag
from pipeline.manifest import manifest_uri, write_manifest
from schemas.record import RunManifest
from stages.core import ledger
from stages.core.records import RECORD_NAME
from stages.core.runner import RunContext
from tests.conftest import REPO, recipe_with
from tests.unit.test_records import checkpoint_stage, evaluate_stage, reseal

MY_REWARD = REPO / "tests" / "plugins" / "my_reward.py"
MODULE = "far_user_concise"  # tests/plugins/my_reward.py, as a user's file beside a recipe
ZEN = "Beautiful is better than ugly"


def own_task_run(root: Path, named: list[str]) -> dict[str, Any]:
    """A run of a task with the user's reward: run.json names `named`, and the grpo record
    holds the digest of tests/plugins/my_reward.py as the file of MODULE's reward."""
    ctx = RunContext(root=str(root), run="own-task")
    recipe = recipe_with(str(root)).model_dump(mode="json")
    recipe["grpo"]["rewards"] = {"format_strict": 0.5, "concise_correct": 1.0}
    recipe["plugins"] = named
    made = RunManifest(
        run="own-task",
        recipe=recipe,
        recipe_source="my-task.yaml",
        created_at=datetime.now(UTC),
        plugins=named,
    )
    write_manifest(ctx.run_uri, made)
    digest = hashlib.sha256(MY_REWARD.read_bytes()).hexdigest()
    sft = checkpoint_stage(ctx, "sft", {}, {})
    inputs = {"sft": sft.output.fingerprint, f"source:reward:concise_correct:{MODULE}": digest}
    grpo = checkpoint_stage(ctx, "grpo", inputs, {"sft": sft.output.uri})
    evaluation = evaluate_stage(ctx, grpo.output)
    return {"ctx": ctx, "grpo": grpo, "eval": evaluation, "digest": digest}


def _far(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """The user's project (their reward module beside the recipe) and another directory."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / f"{MODULE}.py").write_bytes(MY_REWARD.read_bytes())
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    return {"project": project, "elsewhere": elsewhere, "runs": tmp_path / "runs"}


def test_a_clean_own_task_run_audits_from_another_directory(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its plugin is not importable there: run.json is not 'unreadable', status exits 0, and
    both say which plugin's code was not checked (its records were, as data)."""
    run = own_task_run(places["runs"], [MODULE])
    run_uri = run["ctx"].run_uri
    monkeypatch.chdir(places["elsewhere"])
    path = list(sys.path)
    code, out, _ = _far(capsys, "audit", run_uri)
    assert code == 0, out
    assert "unreadable" not in out
    assert f"plugin {MODULE}: not loaded and its code not checked" in out
    assert f"recorded: reward concise_correct, sha256 {run['digest'][:12]};" in out
    assert out.splitlines()[-2].endswith(
        "every record, file and ledger entry matches; plugin code not checked (above)"
    )
    code, out, err = _far(capsys, "status", run_uri)
    assert code == 0, err
    assert " complete " in out and f"plugin {MODULE}: not loaded" in out
    code, out, _ = _far(capsys, "audit", run_uri, "--json")
    assert code == 0 and json.loads(out)["plugins_unchecked"][0].startswith(f"plugin {MODULE}")
    assert sys.path == path and MODULE not in sys.modules  # nothing imported, no cwd added


def test_plugin_checks_the_callers_copy_against_the_record_without_importing_it(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = own_task_run(places["runs"], [MODULE])
    run_uri = run["ctx"].run_uri
    monkeypatch.chdir(places["project"])
    code, out, _ = _far(capsys, "audit", run_uri, "--plugin", MODULE)
    assert code == 0 and out.splitlines()[-2].endswith("everything matches"), out
    assert f"plugin {MODULE}: {places['project'] / MODULE}.py matches the digest" in out
    code, out, _ = _far(capsys, "status", run_uri, "--plugin", MODULE)
    assert code == 0 and "checked, not imported" in out
    assert MODULE not in sys.modules

    marker = places["project"] / "imported"
    edited = MY_REWARD.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n"
    (places["project"] / f"{MODULE}.py").write_text(edited)
    for command in ("audit", "status"):
        code, out, err = _far(capsys, command, run_uri, "--plugin", MODULE)
        assert code == cli.EXIT_INVALID and out == "", out
        [line] = err.splitlines()
        assert line.startswith(f"far: --plugin {MODULE}: {places['project'] / MODULE}.py has ")
        assert f"the run recorded {MODULE} (reward concise_correct, sha256 " in line
        assert "not the code the run used" in line
    assert not marker.exists() and MODULE not in sys.modules

    code, _, err = _far(capsys, "audit", run_uri, "--plugin", "json")  # a module not recorded
    assert code == cli.EXIT_INVALID and "the run's records hold no digest for module" in err
    code, _, err = _far(capsys, "audit", run_uri, "--plugin", "far_no_such_module")
    assert code == cli.EXIT_INVALID and "no module 'far_no_such_module'" in err


def test_a_run_naming_a_standard_module_runs_nothing_of_it(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = own_task_run(places["runs"], ["this"])
    run_uri = run["ctx"].run_uri
    monkeypatch.delitem(sys.modules, "this", raising=False)
    for argv in (["audit", run_uri], ["status", run_uri], ["lineage", run["grpo"].output.uri]):
        code, out, err = _far(capsys, *argv)
        assert code == 0, err
        assert ZEN not in out + err
        assert "plugin this: not loaded" in out
    assert "this" not in sys.modules


def test_a_planted_module_cannot_pass_an_edited_evaluation_audited_from_the_run(
    places: dict[str, Path],
) -> None:
    """run.json names a module planted in the run directory that would make the audit say
    'everything matches'; the audit, in a real `far` process started there, never imports it
    and finds the edits."""
    run = own_task_run(places["runs"], [MODULE])
    run_uri = run["ctx"].run_uri
    published = str(ledger.root(run_uri))
    reseal(Path(run["eval"].record_uri), lambda d: d["metrics"].update({"sft/accuracy": 0.99}))
    data = json.loads(Path(manifest_uri(run_uri)).read_text())
    data["plugins"] = ["far_audit_helper"]
    Path(manifest_uri(run_uri)).write_text(json.dumps(data))
    planted = (  # imported while the audit reads the records: it empties every later check
        "import pipeline.lineage as lineage\n"
        "for name in ('_audit_seal', '_audit_inputs', '_audit_evaluations', '_audit_top_level',"
        " '_audit_ledger'):\n"
        "    setattr(lineage, name, lambda *args, **kwargs: [])\n"
        "lineage.stage_records.verify_files = lambda *args, **kwargs: []\n"
        "print('planted module ran')\n"
    )
    Path(run_uri, "far_audit_helper.py").write_text(planted)
    done = subprocess.run(
        [str(Path(sys.executable).with_name("far")), "audit", run_uri, "--expect-root", published],
        cwd=run_uri,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == cli.EXIT_PROBLEMS, done.stdout + done.stderr
    assert "planted module ran" not in done.stdout
    assert f"{run['eval'].record_uri}: differs from its ledger entry" in done.stdout
    assert "far_audit_helper.py: file at the run's top level" in done.stdout
    assert "plugin far_audit_helper: not loaded" in done.stdout
    assert f"{RECORD_NAME}" in done.stdout and "everything matches" not in done.stdout


def test_the_order_read_from_a_run_is_the_dags_without_any_registration() -> None:
    """Status and audit order a run's nodes from run.json alone, as build_dag would."""
    from pipeline.dag import node_order  # new: the tests above also run against older code

    for base in ("smoke", "smoke-dag"):
        recipe = recipe_with("runs", base)
        assert node_order(recipe) == build_dag(recipe).ids


def test_a_run_finds_a_plugin_beside_it_and_the_directory_shadows_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`far run` (the user's own code) still imports a module beside the recipe: the current
    directory goes last on sys.path, so a file there named like a standard or installed
    module is never what an import of that name gets."""
    from pipeline import plugins
    from stages import rewards

    source = "from stages.rewards import reward\n@reward('far_user_beside')\ndef f(c, r):\n"
    (tmp_path / "far_user_beside.py").write_text(source + "    return 0.0\n")
    for shadow in ("colorsys", "yaml"):  # the standard library's, an installed package's
        (tmp_path / f"{shadow}.py").write_text("raise SystemExit('shadowed')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert plugins.load_plugin("far_user_beside").rewards == ("far_user_beside",)
        assert sys.path[-1] == str(tmp_path)
        for shadow in ("colorsys", "yaml"):  # what an import of the name would get
            spec = PathFinder.find_spec(shadow, sys.path)
            assert spec is not None and spec.origin is not None
            assert not spec.origin.startswith(str(tmp_path)), spec.origin
    finally:
        rewards.unregister_reward("far_user_beside")
        sys.modules.pop("far_user_beside", None)
        plugins.LOADED.pop("far_user_beside", None)


def test_a_forged_record_vouches_for_no_plugin_past_the_published_root(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A writer plants another module file and appends a copy of the grpo record naming its
    digest: against the root `far run` printed, only the records the root covers vouch."""
    run = own_task_run(places["runs"], [MODULE])
    run_uri = run["ctx"].run_uri
    published = str(ledger.root(run_uri))
    planted = MY_REWARD.read_text() + "\n# planted\n"
    (places["project"] / f"{MODULE}.py").write_text(planted)
    digest = hashlib.sha256(planted.encode()).hexdigest()
    original = Path(run["grpo"].record_uri).parent
    forged = original.with_name("grpo-" + "f" * 12)
    shutil.copytree(original, forged)
    label = f"source:reward:concise_correct:{MODULE}"

    def edit(data: dict[str, Any]) -> None:
        data["stage_hash"], data["directory"] = "f" * 64, forged.name
        data["inputs"][label] = digest

    reseal(forged / RECORD_NAME, edit)
    ledger.append(run_uri, str(forged / RECORD_NAME), "record")
    monkeypatch.chdir(places["project"])
    code, out, _ = _far(capsys, "status", run_uri, "--plugin", MODULE)  # the chain vouches
    assert code == 0 and f"sha256 {digest[:12]}); checked, not imported" in out
    code, _, err = _far(capsys, "audit", run_uri, "--expect-root", published, "--plugin", MODULE)
    assert code == cli.EXIT_INVALID and "not the code the run used" in err
    assert f"sha256 {run['digest'][:12]}" in err and MODULE not in sys.modules
