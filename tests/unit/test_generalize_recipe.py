"""recipes/reinforce-generalize.yaml: it validates, its ladder's levels go where the design
says (SFT at levels <= k, pool and validation at k+1, held out tagged k2 / k1 / le_k), every
arm starts from sft with the same steps and batch, the control trains on the pool prompts'
gold chains, the wall-clock-matched control is scored apart from the pick, pass@8 is scored at
k+2, the real tokenizer leaves at least 1,000 k+2 prompts, and its tiny variant validates."""

from __future__ import annotations

from pathlib import Path

from pipeline.dag import build_dag, node_config
from pipeline.recipes import load_recipe
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.modeling.tokenizers import build_tokenizer
from tests.conftest import REPO
from tests.scaled_recipes import scaled_generalize

ARMS = ("control", "self", "orpo", "grpo", "random")
RECIPE = REPO / "recipes" / "reinforce-generalize.yaml"


def test_the_ladder_and_the_arms() -> None:
    recipe = load_recipe(str(RECIPE))
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


def test_the_wall_clock_control_is_reported_apart() -> None:
    """More steps of the control's own data, scored greedily at every level, never picked."""
    recipe = load_recipe(str(RECIPE))
    nodes = {n.id: n for n in recipe.pipeline}
    wall = node_config(recipe, nodes["control_wall"])
    control = node_config(recipe, nodes["control"])
    assert nodes["control_wall"].inputs == nodes["control"].inputs
    assert wall.max_steps > control.max_steps
    assert wall.model_copy(update={"max_steps": control.max_steps}) == control.model_copy(
        update={"checkpoint_every_steps": wall.checkpoint_every_steps}
    )
    for level in ("k2", "k1", "le_k"):
        assert "control_wall" in nodes[level].config.models
    assert "control_wall" not in nodes["pick"].config.candidates
    assert "control_wall" not in nodes["validation"].config.models


def test_the_real_tokenizer_leaves_1000_prompts_at_k2(tmp_path: Path) -> None:
    """The held-out split as data_prep draws it (a prompt over max_prompt_len leaves it)."""
    recipe = load_recipe(str(RECIPE))
    ctx = RunContext(str(tmp_path), "k2", model=recipe.model)
    tokenizer = build_tokenizer(recipe.model, ctx.model_cache, ctx.shared)
    splits, prompt = data_prep.draw_splits(recipe.data, tokenizer, data_prep.Quarantine())
    rows = [data_prep.prompt_row(e, prompt) for e in splits["eval"]]
    assert sum(r.get("tag") == "k2" for r in rows) >= 1000


def test_the_tiny_variant_validates(tmp_path: Path) -> None:
    recipe = scaled_generalize(str(tmp_path))
    assert list(build_dag(recipe).ids)[-4:] == ["k2", "k1", "le_k", "k2_sampled"]
    nodes = {n.id: n for n in recipe.pipeline}
    assert nodes["pairs"].inputs == {"samples": "random"}  # the tiny headroom makes no pair
