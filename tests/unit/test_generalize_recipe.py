"""recipes/reinforce-generalize.yaml: it validates, its ladder's levels go where the design
says (SFT at levels <= k, pool and validation at k+1, held out tagged k2 / k1 / le_k), every
arm starts from sft with the same steps and batch, the control trains on the pool prompts'
gold chains, pass@8 is scored at k+2, and its tiny variant validates too."""

from __future__ import annotations

from pathlib import Path

from pipeline.dag import build_dag, node_config
from pipeline.recipes import load_recipe
from tests.conftest import REPO
from tests.scaled_recipes import scaled_generalize

ARMS = ("control", "self", "orpo", "grpo", "random")


def test_the_ladder_and_the_arms() -> None:
    recipe = load_recipe(str(REPO / "recipes" / "reinforce-generalize.yaml"))
    data = recipe.data
    assert {s.args["max_terms"] for s in data.sft.sources} == {3}
    assert {s.args["min_terms"] for s in data.grpo.sources} == {4}
    assert data.validation is not None and data.validation.sources == data.grpo.sources
    assert {s.tag: s.args["min_terms"] for s in data.eval.sources} == {"k2": 5, "k1": 4, "le_k": 2}
    assert sum(s.size or 0 for s in data.eval.sources if s.tag == "k2") >= 1000
    assert data.grpo.size >= 300
    nodes = {n.id: n for n in recipe.pipeline}
    configs = {arm: node_config(recipe, nodes[arm]) for arm in ARMS}
    assert {c.max_steps for c in configs.values()} == {recipe.grpo.max_steps}
    assert {c.batch_size for c in configs.values() if hasattr(c, "batch_size")} == {4}
    assert configs["random"].rewards == {"random": 1.0}
    assert configs["orpo"].logprobs == "mean"
    assert {nodes[n].config.tag for n in ("k2", "k1", "le_k")} == {"k2", "k1", "le_k"}
    assert build_dag(recipe).ids.index("pick") < build_dag(recipe).ids.index("k2")
    # the control: the pool's prompts (GRPO's) with their gold chains, from data_prep
    assert data.gold_targets and nodes["pool"].config.gold_sft
    assert nodes["control"].inputs == {"dataset": "pool", "policy": "sft"}
    assert nodes["grpo"].inputs["dataset"] == nodes["random"].inputs["dataset"] == "pool"
    sampled = nodes["k2_sampled"].config
    assert (sampled.tag, sampled.samples, sampled.temperature) == ("k2", 8, 1.0)
    assert set(sampled.models) == set(ARMS) | {"sft"}


def test_the_tiny_variant_validates(tmp_path: Path) -> None:
    recipe = scaled_generalize(str(tmp_path))
    assert list(build_dag(recipe).ids)[-4:] == ["k2", "k1", "le_k", "k2_sampled"]
    nodes = {n.id: n for n in recipe.pipeline}
    assert nodes["pairs"].inputs == {"samples": "random"}  # the tiny headroom makes no pair
