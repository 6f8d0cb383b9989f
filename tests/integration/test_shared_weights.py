"""A run shares one base network and tokenizer across its stages, with unchanged results.

The default pipeline (data_prep -> sft -> grpo -> evaluate of base, sft and grpo) runs on the
tiny model twice, node by node as the flow runs it: once with every stage building its own
network (RunContext.shared None, as before sharing), once with the run's SharedBuilds. Every
checkpointed array (parameters and optimizer state, every step) must be bitwise equal, as must
GRPO's rollouts, the evaluation's completions and scores; and with sharing the base weights
are built exactly once for the whole run.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from pipeline import nodes
from pipeline.dag import build_dag, node_config
from schemas.recipe import Recipe
from stages.core.records import read_record
from stages.core.runner import RunContext
from stages.core.shared import SharedBuilds
from stages.modeling import models
from tests.conftest import recipe_with


def _recipe(root: str) -> Recipe:
    return recipe_with(
        root,
        data={"eval": {"size": 8}, "grpo": {"size": 4}, "sft": {"size": 32}},
        sft={"max_steps": 2, "checkpoint_every_steps": 1},
        grpo={"max_steps": 2, "checkpoint_every_steps": 2, "max_generation_tokens": 8},
        eval={"max_generation_tokens": 8},
    )


def _run(recipe: Recipe, ctx: RunContext) -> dict[str, Any]:
    """Every node of the recipe's DAG in order, as the flow runs them: node id -> outcome."""
    dag = build_dag(recipe)
    outputs: dict[str, Any] = {}
    outcomes = {}
    for node in dag.nodes:
        inputs = {name: outputs[source] for name, source in node.inputs.items()}
        outcome = nodes.run_node(recipe, node, node_config(recipe, node), inputs, ctx)
        assert not outcome.skipped
        outputs[node.id], outcomes[node.id] = outcome.output, outcome
    return outcomes


def _checkpoints(outcomes: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    """Every saved array (parameters and optimizer state) of every checkpoint step, by
    "{node}/{step path}/{part}{tree path}"."""
    arrays = {}
    for node, outcome in outcomes.items():
        directory = Path(outcome.record_uri).parent
        for part_dir in sorted(directory.glob("checkpoints/**/model_params")):
            step_dir = part_dir.parent
            for part in ("model_params", "optimizer_state"):
                tree = ocp.PyTreeCheckpointer().restore(step_dir / part)
                for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
                    where = step_dir.relative_to(directory)
                    arrays[f"{node}/{where}/{part}{jax.tree_util.keystr(path)}"] = leaf
    return arrays


def _samples(outcomes: dict[str, Any]) -> dict[str, str]:
    """The digest of each stage's samples file (GRPO's rollouts, the evaluation's outputs)."""
    digests = {}
    for node, outcome in outcomes.items():
        record = read_record(outcome.record_uri)
        assert record is not None
        for name, file in record.files.items():
            if name.endswith("samples.jsonl"):
                digests[f"{node}/{name}"] = file.digest
    return digests


def _scores(outcomes: dict[str, Any]) -> list[dict[str, Any]]:
    """Each evaluated model's scores, without where its checkpoint lives (the roots differ)."""
    scores = outcomes["evaluate"].output.scores
    return [s.model_dump(exclude={"checkpoint_uri"}) for s in scores]


@pytest.fixture
def counted_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every base-network build of the process (the real build, counted on the way)."""
    calls: list[str] = []
    build: Callable[..., Any] = models.build_base_model

    def counting(spec: Any, mesh: Any, cache_dir: str) -> Any:
        calls.append(spec.model_dump_json())
        return build(spec, mesh, cache_dir)

    monkeypatch.setattr(models, "build_base_model", counting)
    return calls


@pytest.mark.slow  # two runs of the whole pipeline: ~90 s
def test_shared_base_weights_change_no_result(
    tmp_path: Path, model_cache: str, counted_builds: list[str]
) -> None:
    recipe = _recipe(str(tmp_path / "own"))
    ctx = RunContext(str(tmp_path / "own"), recipe.name, cache_dir=model_cache)
    own = _run(recipe, ctx)
    builds_without = len(counted_builds)
    counted_builds.clear()

    shared = SharedBuilds()
    ctx = dataclasses.replace(ctx, root=str(tmp_path / "shared"), shared=shared)
    with_sharing = _run(recipe, ctx)

    assert builds_without == 3  # sft, grpo's reference, evaluate's base: each its own
    assert len(counted_builds) == 1  # the whole run: one build of the base weights
    assert shared.builds == {"base_model": 1, "tokenizer": 1}
    # data_prep and SFT have the same stage hashes; GRPO's and the evaluation's hashes cover
    # the SFT checkpoint's fingerprint, which covers Orbax's metadata (the save time): they
    # differ between any two runs, so their equality is shown by their content instead
    for node in ("data_prep", "sft"):
        assert _dir(with_sharing[node]) == _dir(own[node])
    shared_arrays, own_arrays = _checkpoints(with_sharing), _checkpoints(own)
    assert shared_arrays.keys() == own_arrays.keys()
    assert any(k.startswith("grpo/") for k in own_arrays)
    assert any(k.startswith("sft/") for k in own_arrays)
    for key, value in own_arrays.items():
        np.testing.assert_array_equal(np.asarray(shared_arrays[key]), np.asarray(value), key)
    assert _samples(with_sharing) == _samples(own)
    assert len(_samples(own)) == 2  # GRPO's rollouts and the evaluation's completions
    assert _scores(with_sharing) == _scores(own)


def _dir(outcome: Any) -> str:
    """The stage directory's name, {node}-{hash12}: equal names, equal stage hashes."""
    return posixpath.basename(posixpath.dirname(outcome.record_uri))


def test_a_network_whose_weights_change_is_never_the_shared_one(tmp_path: Path) -> None:
    """Full-weight training or restore asks for a private network: built apart from the run's
    shared one, which later stages still get unchanged."""
    recipe = _recipe(str(tmp_path))
    mesh = models.build_mesh(recipe.mesh)
    shared = SharedBuilds()
    first = models.base_model(recipe.model, mesh, "unused", shared, private=False)
    private = models.base_model(recipe.model, mesh, "unused", shared, private=True)
    again = models.base_model(recipe.model, mesh, "unused", shared, private=False)
    assert again is first
    assert private is not first
    assert shared.builds == {"base_model": 1}
    assert models.base_model(recipe.model, mesh, "unused", None, private=False) is not first
