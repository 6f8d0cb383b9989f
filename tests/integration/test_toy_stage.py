"""A stage kind added the way docs/adding-a-stage.md says, one module (toy_stage.py, whose last
line registers it), is written in a recipe's YAML `pipeline:` like a shipped kind, parsed by the
real recipe loader, and runs in a real DAG: build_dag checks its edges and its config from the
registration, the node runner (pipeline/nodes.py) calls its entry point, its records and
directories are a stage's like any other, a second run skips it, and the generated stage table
lists it. A kind nothing registers is refused before anything runs, naming the node, the kind
and the registered kinds.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.gen_docs import stages_page
from pipeline.dag import build_dag, node_config
from pipeline.nodes import run_node
from pipeline.recipes import RecipeError, load_recipe
from schemas.artifacts import DatasetArtifact
from schemas.recipe import Recipe, RegisteredNode
from schemas.record import StageRecord
from stages import registry
from stages.core import storage
from stages.core.datasets import load_prompts
from stages.core.errors import InputError
from stages.core.runner import RunContext, StageOutcome
from tests.conftest import REPO

TOY = "tests.integration.toy_stage"

PIPELINE = """
pipeline:
  - {id: data_prep, kind: data_prep}
  - id: first
    kind: first_prompts
    inputs: {dataset: data_prep}
  - id: fewer
    kind: first_prompts
    inputs: {dataset: first}
    config: {keep: 2, order: id}
"""


@pytest.fixture
def toy_kind() -> Iterator[registry.StageSpec]:
    """The toy module imported (its last line registers the kind), unregistered afterwards."""
    module = importlib.import_module(TOY)
    try:
        yield registry.spec(module.KIND)
    finally:
        registry.unregister(module.KIND)
        sys.modules.pop(TOY, None)  # the next import registers it again


def toy_recipe(root: Path, pipeline: str = PIPELINE) -> Recipe:
    """recipes/smoke.yaml with a `pipeline:` written in YAML, read by the real recipe loader."""
    path = root / "toy.yaml"
    path.write_text((REPO / "recipes" / "smoke.yaml").read_text() + pipeline)
    return load_recipe(str(path), overrides={"storage_root": str(root / "runs")})


def run_dag(recipe: Recipe, ctx: RunContext) -> dict[str, StageOutcome[Any]]:
    """What the flow does per node (flows/far_flow.py), without Prefect: each node in the DAG's
    order through the real node runner, fed its upstream nodes' outputs."""
    outcomes: dict[str, StageOutcome[Any]] = {}
    for node in build_dag(recipe).nodes:
        inputs = {name: outcomes[source].output for name, source in node.inputs.items()}
        outcomes[node.id] = run_node(recipe, node, node_config(recipe, node), inputs, ctx)
    return outcomes


def test_a_registered_toy_kind_runs_in_a_dag_and_resumes(
    toy_kind: registry.StageSpec, tmp_path: Path, model_cache: str
) -> None:
    recipe = toy_recipe(tmp_path)
    assert recipe.pipeline is not None and isinstance(recipe.pipeline[1], RegisteredNode)
    ctx = RunContext(root=str(tmp_path / "runs"), run=recipe.name, cache_dir=model_cache)
    first = run_dag(recipe, ctx)
    assert [o.skipped for o in first.values()] == [False, False, False]
    full = load_prompts(first["data_prep"].output, "grpo_train")
    kept = first["first"].output
    assert isinstance(kept, DatasetArtifact)
    assert [r["id"] for r in load_prompts(kept, "grpo_train")] == [r["id"] for r in full[:4]]
    fewer = load_prompts(first["fewer"].output, "grpo_train")
    assert [r["id"] for r in fewer] == sorted(str(r["id"]) for r in full[:4])[:2]
    for node_id in ("first", "fewer"):
        record = StageRecord.model_validate(storage.read_json(first[node_id].record_uri))
        assert record.stage == "first_prompts"
        assert record.node == node_id
        assert Path(record.directory).name == f"{node_id}-{record.stage_hash[:12]}"
        assert record.metrics["kept"] == (4 if node_id == "first" else 2)
    again = run_dag(recipe, ctx)
    assert all(o.skipped for o in again.values())
    assert {k: o.output for k, o in again.items()} == {k: o.output for k, o in first.items()}


def test_the_toy_kinds_edges_and_config_are_checked_from_its_registration(
    toy_kind: registry.StageSpec, tmp_path: Path
) -> None:
    sft = "  - {id: sft, kind: sft, inputs: {dataset: first}}\n"
    with pytest.raises(RecipeError, match=r"sft\.dataset <- first: expected a dataset with split "):
        toy_recipe(tmp_path, PIPELINE + sft)
    unfed = PIPELINE.replace("inputs: {dataset: data_prep}", "inputs: {}")
    with pytest.raises(RecipeError, match=r"first \(first_prompts\) needs an input 'dataset'"):
        toy_recipe(tmp_path, unfed)
    bad = PIPELINE.replace("keep: 2", "keep: 0")
    with pytest.raises(RecipeError, match=r"fewer \(first_prompts\): config\.keep: Input should "):
        toy_recipe(tmp_path, bad)
    typo = PIPELINE.replace("keep: 2", "kep: 2")
    with pytest.raises(RecipeError, match=r"config\.kep: Extra inputs are not permitted"):
        toy_recipe(tmp_path, typo)


def test_the_stage_table_lists_what_is_registered(toy_kind: registry.StageSpec) -> None:
    assert "| `first_prompts` | The first prompts" in stages_page()


def test_an_unregistered_kind_is_refused_before_anything_runs(tmp_path: Path) -> None:
    assert TOY not in sys.modules
    with pytest.raises(RecipeError) as refused:
        toy_recipe(tmp_path)
    assert isinstance(refused.value.__cause__, InputError)
    message = str(refused.value)
    assert "first: no stage kind 'first_prompts' is registered; kinds: ['data_prep'," in message
    assert "first_prompts" not in stages_page()


def test_far_validate_loads_a_plugin_kind_by_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`far validate --plugin MODULE` imports the kind's module before the recipe loads, so a
    recipe's YAML can name a kind FAR does not ship; a module that cannot be imported, or
    registers nothing, is refused with exit 2 before anything else."""
    from flows import cli

    monkeypatch.setattr(os, "environ", dict(os.environ))  # far sets Prefect's defaults in it
    path = tmp_path / "toy.yaml"
    recipe = (REPO / "recipes" / "smoke.yaml").read_text() + PIPELINE
    path.write_text(recipe.replace("storage_root: runs", f"storage_root: {tmp_path / 'runs'}"))
    try:
        assert cli.main(["validate", str(path), "--plugin", TOY]) == 0
        rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
        assert [r[:2] for r in rows] == [
            ["data_prep", "data_prep"],
            ["first", "first_prompts"],
            ["fewer", "first_prompts"],
        ]
    finally:
        registry.unregister("first_prompts")
        sys.modules.pop(TOY, None)
    assert cli.main(["validate", str(path)]) == 2  # without the plugin: an unknown kind
    assert "no stage kind 'first_prompts' is registered" in capsys.readouterr().err
    assert cli.main(["validate", str(path), "--plugin", "no_such.module"]) == 2
    assert "--plugin no_such.module: cannot import it" in capsys.readouterr().err
    assert cli.main(["validate", str(path), "--plugin", "json"]) == 2
    assert "registered no stage kind" in capsys.readouterr().err
