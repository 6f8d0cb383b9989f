"""The two real-model demo recipes validate, and the reinforcement one differs from the
default demo only where its measurement needs it (more held-out prompts, a shorter SFT that
leaves GRPO a format to learn, its GRPO settings), so its SFT row is the demo's SFT, stopped
early, on the same task."""

from __future__ import annotations

from pipeline.recipes import load_recipe
from tests.conftest import REPO


def test_the_reinforce_demo_is_the_demo_with_more_prompts_and_its_grpo() -> None:
    demo = load_recipe(str(REPO / "recipes" / "demo.yaml"))
    reinforce = load_recipe(str(REPO / "recipes" / "demo-reinforce.yaml"))
    assert reinforce.model == demo.model
    shorter = {"max_steps": reinforce.sft.max_steps, "checkpoint_every_steps": 6}
    assert reinforce.sft == demo.sft.model_copy(update=shorter)
    assert reinforce.sft.max_steps < demo.sft.max_steps
    for split in ("eval", "grpo", "sft"):
        assert getattr(reinforce.data, split).sources == getattr(demo.data, split).sources
    assert reinforce.data.eval.size >= 256  # enough paired prompts for a McNemar test
    assert reinforce.eval.models == ["sft", "grpo"]  # GRPO is compared with SFT directly
    assert reinforce.grpo.max_steps * reinforce.grpo.batch_size <= reinforce.data.grpo.size


def test_the_headroom_recipe_filters_on_its_own_policy_before_grpo() -> None:
    """recipes/reinforce-headroom.yaml: the DAG checks out, the headroom evaluation samples the
    SFT policy at GRPO's temperature with at least one sample per GRPO completion, the filter
    keeps the informative band of that evaluation, and GRPO trains the SFT policy on it."""
    from pipeline.dag import build_dag

    recipe = load_recipe(str(REPO / "recipes" / "reinforce-headroom.yaml"))
    nodes = {node.id: node for node in build_dag(recipe).nodes}
    headroom, band = nodes["headroom"].config, nodes["informative"].config
    assert headroom.split == "grpo_train" and headroom.greedy
    assert headroom.temperature == recipe.grpo.temperature
    assert headroom.samples >= recipe.grpo.num_generations
    assert (band.above, band.below, band.min_prompts) == (0.0, 1.0, recipe.grpo.batch_size)
    assert nodes["grpo"].inputs == {"dataset": "informative", "policy": "sft"}
    assert recipe.data.eval.size >= 256 and recipe.grpo.beta == 0.0
    held_out = nodes["evaluate"].config  # greedy and sampled, on the held-out split
    assert held_out.split == "eval" and held_out.greedy and held_out.samples >= 4
    assert held_out.temperature == recipe.grpo.temperature and held_out.models == ["sft", "grpo"]
