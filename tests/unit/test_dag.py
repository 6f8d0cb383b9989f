"""The pipeline DAG: the default is the original four stages; bad graphs are refused by edge."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.dag import DagError, build_dag, node_config
from pipeline.recipes import RecipeError
from schemas.recipe import HardSubsetConfig
from stages import registry
from tests.conftest import recipe_with

ROOT = "/tmp/far-dag"
DPO = {"max_steps": 2}
HARD = {"model": "grpo"}


def pipeline(*nodes: dict[str, Any]) -> list[dict[str, Any]]:
    return list(nodes)


def node(id: str, kind: str, config: dict[str, Any] | None = None, **inputs: str) -> dict:
    out: dict[str, Any] = {"id": id, "kind": kind, "inputs": inputs}
    if config is not None:
        out["config"] = config
    return out


DATA = node("data", "data_prep")
SFT = node("tune", "sft", dataset="data")
GRPO = node("rl", "grpo", dataset="data", policy="tune")
EVAL = node("eval1", "evaluate", dataset="data", tune="tune", rl="rl")
TRAIN_SPLIT = {"models": ["rl"], "split": "grpo_train"}
EVAL_TRAIN = node("eval_train", "evaluate", TRAIN_SPLIT, dataset="data", rl="rl")
LONG = pipeline(
    DATA,
    SFT,
    GRPO,
    EVAL,
    EVAL_TRAIN,
    node("hard", "hard_subset", {"model": "rl"}, evaluation="eval_train", dataset="data"),
    node("rl2", "grpo", dataset="hard", policy="rl"),
    node("eval2", "evaluate", dataset="data", rl2="rl2"),
    node("teach", "self_teach", dataset="data", policy="rl"),
    node("tune2", "sft", dataset="teach", policy="rl"),  # continues from rl
    node("pairs", "preferences", samples="eval1", dataset="data"),
    node("pref", "dpo", DPO, policy="tune", preferences="pairs"),
    node("small", "distill", {"max_steps": 1}, dataset="data", teacher="rl"),
)

# (pipeline, the error's expected text)
INVALID: list[tuple[list[dict[str, Any]], str]] = [
    (
        pipeline(
            DATA,
            node("rl", "grpo", dataset="data", policy="rl2"),
            node("rl2", "grpo", dataset="data", policy="rl"),
        ),
        "the pipeline has a cycle through rl -> rl2 -> rl",
    ),
    (
        pipeline(DATA, SFT, node("rl", "grpo", dataset="data", policy="tune2")),
        "rl.policy <- tune2: no node 'tune2'",
    ),
    (
        pipeline(DATA, SFT, node("rl", "grpo", dataset="data")),
        "rl (grpo) needs an input 'policy' (a checkpoint)",
    ),
    (
        pipeline(DATA, SFT, GRPO, EVAL, node("rl2", "grpo", dataset="data", policy="eval1")),
        "rl2.policy <- eval1: expected a checkpoint, got an eval report",
    ),
    (
        pipeline(DATA, node("tune", "sft", dataset="data", policy="data")),
        "tune.policy <- data: expected a checkpoint, got a dataset",
    ),
    (
        pipeline(DATA, SFT, node("tune2", "sft", dataset="data", start="tune")),
        "tune2.start <- tune: sft has no input 'start'; inputs: ['dataset', 'policy']",
    ),
    (
        pipeline(DATA, SFT, node("rl", "grpo", dataset="tune", policy="tune")),
        "rl.dataset <- tune: expected a dataset with split grpo_train, got a checkpoint",
    ),
    (
        pipeline(
            DATA,
            SFT,
            GRPO,
            EVAL_TRAIN,
            node("hard", "hard_subset", HARD, evaluation="eval_train", dataset="data"),
            node("tune2", "sft", dataset="hard"),
        ),
        "tune2.dataset <- hard: expected a dataset with split sft_train, got a hard_subset",
    ),
    (  # hard prompts from the held-out split would be trained on, then evaluated
        pipeline(
            DATA,
            SFT,
            GRPO,
            EVAL,
            node("hard", "hard_subset", HARD, evaluation="eval1", dataset="data"),
        ),
        "hard.evaluation <- eval1: eval1 scores the held-out eval split",
    ),
    (
        pipeline(
            DATA,
            SFT,
            GRPO,
            EVAL_TRAIN,
            node("teach", "self_teach", dataset="data", policy="rl"),
            node("hard", "hard_subset", HARD, evaluation="eval_train", dataset="teach"),
        ),
        "hard.dataset <- teach: must be the dataset eval_train evaluated (data)",
    ),
    (
        pipeline(
            DATA,
            SFT,
            GRPO,
            node("pairs", "preferences", samples="rl"),
            node("hard", "hard_subset", HARD, evaluation="pairs", dataset="data"),
        ),
        "hard.evaluation <- pairs: expected an eval report, got preference pairs",
    ),
    (
        pipeline(DATA, SFT, node("pairs", "preferences", samples="data")),
        "pairs.samples <- data: expected an eval report or a checkpoint, got a dataset",
    ),
    (
        pipeline(DATA, SFT, node("pairs", "preferences", samples="tune")),
        "pairs.samples <- tune: expected the output of a evaluate or grpo node, got a sft",
    ),
    (
        pipeline(DATA, SFT, node("pref", "dpo", DPO, policy="tune", preferences="tune")),
        "pref.preferences <- tune: expected preference pairs, got a checkpoint",
    ),
    (
        pipeline(DATA, SFT, node("e", "evaluate", {"models": ["base", "rl"]}, dataset="data")),
        "e: eval model 'rl' is neither 'base', a checkpoint URI, nor an input of this node",
    ),
    (pipeline(DATA, node("data", "sft", dataset="data")), "node id 'data' is used twice"),
    (
        pipeline(
            DATA,
            node("pairs", "preferences"),
            node("small", "distill", {"max_steps": 1}, dataset="data", teacher="pairs"),
        ),
        "small.teacher <- pairs: expected a checkpoint, got preference pairs",
    ),
]


@pytest.mark.parametrize(("nodes", "message"), INVALID)
def test_invalid_pipelines_are_refused_naming_the_edge(
    nodes: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(RecipeError, match="invalid pipeline") as caught:
        recipe_with(ROOT, pipeline=nodes)  # type: ignore[arg-type]
    assert message in str(caught.value)
    assert isinstance(caught.value.__cause__, DagError)


def test_default_dag_is_the_four_original_stages() -> None:
    recipe = recipe_with(ROOT)
    dag = build_dag(recipe)
    assert dag.ids == ("data_prep", "sft", "grpo", "evaluate")
    assert dag.edges() == [
        ("data_prep", "sft", "dataset"),
        ("data_prep", "grpo", "dataset"),
        ("sft", "grpo", "policy"),
        ("data_prep", "evaluate", "dataset"),
        ("grpo", "evaluate", "grpo"),
        ("sft", "evaluate", "sft"),
    ]
    configs = [node_config(recipe, n) for n in dag.nodes]
    assert configs == [recipe.data, recipe.sft, recipe.grpo, recipe.eval]


def test_long_pipeline_is_ordered_topologically() -> None:
    recipe = recipe_with(ROOT, pipeline=LONG)  # type: ignore[arg-type]
    dag = build_dag(recipe)
    position = {node_id: i for i, node_id in enumerate(dag.ids)}
    for source, target, _ in dag.edges():
        assert position[source] < position[target]
    assert set(dag.ids) == {n["id"] for n in LONG}
    evaluate2 = node_config(recipe, dag.node("eval2"))
    assert evaluate2.models == ["base", "rl2"]  # the recipe's eval section, these models
    assert evaluate2.split == "eval"
    assert node_config(recipe, dag.node("eval_train")).split == "grpo_train"


def test_pipeline_order_free_nodes_keep_recipe_order() -> None:
    """A node listed before its inputs waits for them; otherwise the recipe's order holds."""
    reordered = [LONG[0], LONG[1], LONG[8], LONG[9], *LONG[2:8], *LONG[10:]]
    dag = build_dag(recipe_with(ROOT, pipeline=reordered))  # type: ignore[arg-type]
    assert dag.ids[:6] == ("data", "tune", "rl", "teach", "tune2", "eval1")


def test_node_ids_cannot_contain_a_dash() -> None:
    with pytest.raises(RecipeError, match="id"):
        recipe_with(ROOT, pipeline=[node("data-1", "data_prep")])  # type: ignore[arg-type]


def test_node_id_names_the_directory_and_the_hash_stays() -> None:
    """The default DAG's ids are the kinds: the original directories; another id only renames
    the directory, the stage hash (what was computed) is the same."""
    from stages import sft
    from stages.core.decisions import stage_directory
    from stages.core.runner import RunContext

    recipe = recipe_with(ROOT)
    digest = sft.identity(recipe.sft, recipe.model, "a" * 64).digest
    plain = RunContext(root="/r", run="x")
    assert stage_directory(plain, "sft", digest) == f"/r/x/sft-{digest[:12]}"
    named = RunContext(root="/r", run="x", node="sft")
    assert stage_directory(named, "sft", digest) == f"/r/x/sft-{digest[:12]}"
    other = RunContext(root="/r", run="x", node="sft_self")
    assert stage_directory(other, "sft", digest) == f"/r/x/sft_self-{digest[:12]}"


def test_a_registered_kind_gets_the_checks_its_ports_declare() -> None:
    """The DAG check reads what a port declares, not which kind owns it: a kind registered
    outside FAR that trains on an evaluation's scored prompts is refused the held-out split as
    hard_subset is, and its config (a mapping in the schema) is read with its config model."""
    spec = registry.StageSpec(
        "harder", HardSubsetConfig, "x:run", "dataset", registry.spec("hard_subset").ports
    )
    leaky = node("h", "harder", HARD, evaluation="eval1", dataset="data")
    with registry.registered(spec):
        with pytest.raises(RecipeError, match=r"h\.evaluation <- eval1: eval1 scores the held-out"):
            recipe_with(ROOT, pipeline=pipeline(DATA, SFT, GRPO, EVAL, leaky))
        held_apart = node("h", "harder", HARD, evaluation="eval_train", dataset="data")
        recipe = recipe_with(ROOT, pipeline=pipeline(DATA, SFT, GRPO, EVAL_TRAIN, held_apart))
        assert node_config(recipe, build_dag(recipe).node("h")) == HardSubsetConfig(**HARD)
