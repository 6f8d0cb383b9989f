"""`--plugin` modules that cannot work are refused in one line (exit 2) before any compute,
whatever goes wrong in them; a run that used a plugin kind records its module, and `far status`
and `far audit` read the run in a later process as data, importing none of it.

The plugins are real modules written to a temporary directory on sys.path, imported by the
real `far` main in this process.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows import cli
from pipeline import manifest
from pipeline.dag import build_dag, node_config
from pipeline.nodes import run_node
from pipeline.recipes import load_recipe
from stages import registry
from stages.core.runner import RunContext
from tests.conftest import REPO

SMOKE = str(REPO / "recipes" / "smoke.yaml")
TOY = "tests.integration.toy_stage"
SPEC = """
from stages.registry import StageSpec, register
from schemas.recipe import HardSubsetConfig
register(StageSpec({kind!r}, HardSubsetConfig, {entry!r}, "dataset"))
"""


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    saved, kinds = dict(os.environ), set(registry.REGISTRY)
    yield
    os.environ.clear()
    os.environ.update(saved)
    for kind in set(registry.REGISTRY) - kinds:
        registry.unregister(kind)


def _plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == cli.EXIT_INVALID, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("far: --plugin"), err
    return lines[0]


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("def broken(:\n    pass\n", "syntax error at"),
        (SPEC.format(kind="sft", entry="x:run"), "'sft' is registered already"),
        ("import sys\nsys.exit(0)\n", "called sys.exit(0)"),
        ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
        (SPEC.format(kind="ghost", entry="no_such_module_far:run"), "'no_such_module_far:run'"),
        (SPEC.format(kind="ghost2", entry="stages.hard_subset:nothing"), "cannot be imported"),
    ],
    ids=["syntax", "duplicate-kind", "sys-exit-0", "raises", "entry-module", "entry-function"],
)
def test_a_broken_plugin_is_one_line_before_compute(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
    says: str,
) -> None:
    name = _plugin(tmp_path, monkeypatch, "far_test_plugin", source)
    for verb in ("validate", "run"):
        line = _refused(capsys, verb, SMOKE, "--root", str(tmp_path / "runs"), "--plugin", name)
        assert says in line, line
        sys.modules.pop(name, None)
    assert not (tmp_path / "runs").exists()


def test_an_empty_plugin_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(capsys, "validate", SMOKE, "--root", str(tmp_path), "--plugin", "")
    assert "empty module name" in line


@pytest.fixture
def plugin_run(tmp_path: Path, model_cache: str) -> Iterator[str]:
    """A run whose recipe names the toy kind (a real data_prep and a real toy node, run by the
    node runner; its session opened as a run opens it), then the kind forgotten as a new
    process would not know it."""
    importlib.import_module(TOY)
    path = tmp_path / "toy.yaml"
    pipeline = """
pipeline:
  - {id: data_prep, kind: data_prep}
  - {id: first, kind: first_prompts, inputs: {dataset: data_prep}}
"""
    path.write_text((REPO / "recipes" / "smoke.yaml").read_text() + pipeline)
    recipe = load_recipe(str(path), overrides={"storage_root": str(tmp_path / "runs")})
    ctx = RunContext(root=str(tmp_path / "runs"), run=recipe.name, cache_dir=model_cache)
    manifest.open_session(recipe, ctx, str(path))
    outputs = {}
    for node in build_dag(recipe).nodes:
        inputs = {name: outputs[source] for name, source in node.inputs.items()}
        outcome = run_node(recipe, node, node_config(recipe, node), inputs, ctx)
        outputs[node.id] = outcome.output
    yield ctx.run_uri
    registry.unregister("first_prompts")
    sys.modules.pop(TOY, None)


def test_status_and_audit_read_a_run_that_used_a_plugin_kind(
    plugin_run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """They import no module the run names: the kind is read as data, and listed as not
    loaded, whether this process registered it or not."""
    assert manifest.read_manifest(plugin_run).plugins == [TOY]
    for forget in (False, True):
        if forget:  # as in a new process: the kind is not registered
            registry.unregister("first_prompts")
            sys.modules.pop(TOY, None)
        assert cli.main(["status", plugin_run]) == 0, capsys.readouterr()
        out = capsys.readouterr().out
        assert "first" in out and "complete" in out
        assert "stage kinds ['first_prompts']: not loaded" in out
        assert cli.main(["audit", plugin_run]) == 0, capsys.readouterr()
        out = capsys.readouterr().out
        assert f"plugin {TOY}: not loaded and its code not checked" in out
        assert "every record, file and ledger entry matches; plugin code not checked" in out
    assert "first_prompts" not in registry.REGISTRY and TOY not in sys.modules  # no import


def test_status_reads_a_run_that_did_not_record_its_plugin(
    plugin_run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run.json written before runs recorded their plugins needs no --plugin; a kind's
    module has no recorded digest, so --plugin cannot check it and is refused."""
    old = manifest.read_manifest(plugin_run)
    manifest.write_manifest(plugin_run, old.model_copy(update={"plugins": []}))
    registry.unregister("first_prompts")
    sys.modules.pop(TOY, None)
    assert cli.main(["status", plugin_run]) == 0
    assert "first" in capsys.readouterr().out
    code = cli.main(["status", plugin_run, "--plugin", TOY])
    err = capsys.readouterr().err
    assert code == cli.EXIT_INVALID and len(err.splitlines()) == 1
    assert f"the run's records hold no digest for module {TOY!r}" in err
    assert TOY not in sys.modules
