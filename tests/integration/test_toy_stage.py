"""A stage kind added the way docs/adding-a-stage.md says, one module (toy_stage.py) plus one
line (its registration), runs in a real DAG: build_dag checks its edges from the registration,
the node runner (pipeline/nodes.py) calls its entry point, its records and directories are a
stage's like any other, a second run skips it, and the generated stage table lists it. Once
unregistered, a recipe naming it is refused before anything runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.gen_docs import stages_page
from pipeline.dag import DagError, build_dag, node_config
from pipeline.nodes import run_node
from schemas.artifacts import DatasetArtifact
from schemas.recipe import DataPrepNode, Recipe, SFTNode
from schemas.record import StageRecord
from stages import registry
from stages.core import storage
from stages.core.datasets import load_prompts
from stages.core.runner import RunContext, StageOutcome
from tests.conftest import recipe_with
from tests.integration import toy_stage
from tests.integration.toy_stage import FirstPromptsConfig, FirstPromptsNode


@pytest.fixture
def toy_kind() -> Iterator[registry.StageSpec]:
    with registry.registered(toy_stage.SPEC) as spec:  # the one line (BUILTIN for a shipped kind)
        yield spec


def toy_recipe(root: Path, *extra: Any) -> Recipe:
    """The smoke recipe with a pipeline data_prep -> first -> fewer (two first_prompts nodes)."""
    nodes = [
        DataPrepNode(id="data_prep", kind="data_prep"),
        FirstPromptsNode(id="first", kind="first_prompts", inputs={"dataset": "data_prep"}),
        FirstPromptsNode(
            id="fewer",
            kind="first_prompts",
            inputs={"dataset": "first"},
            config=FirstPromptsConfig(keep=2, order="id"),
        ),
        *extra,
    ]
    # a shipped kind's node is one more member of schemas.recipe.StageNode; the test's own
    # kind joins the validated recipe's pipeline directly
    return recipe_with(str(root)).model_copy(update={"pipeline": nodes})


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
    ctx = RunContext(root=str(tmp_path), run=recipe.name, cache_dir=model_cache)
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


def test_the_toy_kinds_edges_are_checked_from_its_registration(
    toy_kind: registry.StageSpec, tmp_path: Path
) -> None:
    sft = SFTNode(id="sft", kind="sft", inputs={"dataset": "first"})
    with pytest.raises(DagError, match=r"sft\.dataset <- first: expected a dataset with split "):
        build_dag(toy_recipe(tmp_path, sft))
    recipe = toy_recipe(tmp_path).model_copy(
        update={
            "pipeline": [
                DataPrepNode(id="data_prep", kind="data_prep"),
                FirstPromptsNode(id="first", kind="first_prompts"),
            ]
        }
    )
    with pytest.raises(DagError, match=r"first \(first_prompts\) needs an input 'dataset'"):
        build_dag(recipe)


def test_the_stage_table_lists_what_is_registered(toy_kind: registry.StageSpec) -> None:
    assert "| `first_prompts` | The first prompts" in stages_page()


def test_an_unregistered_kind_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(DagError, match="first: no stage kind 'first_prompts' is registered"):
        build_dag(toy_recipe(tmp_path))
    assert "first_prompts" not in stages_page()
