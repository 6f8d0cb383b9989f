"""baseline: greedy (stages/grpo/baseline.py, ReMax): each completion's advantage is exactly
R(sample) - R(greedy completion of its prompt), per prompt group in Tunix's row order, through
Tunix's own reward manager and FAR's registered estimator. The greedy decode is the one part
that needs a model: a stand-in returns fixed greedy completions (the tiny-model run in
tests/integration/test_grpo_greedy_baseline.py decodes them for real)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from tunix.rl import function_registry, rl_cluster
from tunix.rl.reward_manager import SequenceRewardManager

from pipeline.recipes import RecipeError
from schemas.recipe import GRPOConfig
from stages import rewards
from stages.grpo import advantages, metrics, training
from stages.grpo.baseline import NAME, GreedyBaseline, group_prompts
from stages.registry import hashed_config
from tests.conftest import recipe_with

G = 4
PROMPTS = ["what is 3+4?", "what is 1+1?", "what is 2+2?"]
ANSWERS = ["7", "2", "4"]


def tagged(answer: str) -> str:
    return f"<reasoning>x</reasoning><answer>{answer}</answer>"


# greedy: prompt 0 formatted but wrong (R 1), prompt 1 right (R 2), prompt 2 junk (R 0)
GREEDY = [tagged("8"), tagged("2"), "junk"]
SAMPLES = [
    *[tagged("7"), tagged("8"), tagged("8"), "7"],  # R 2, 1, 1, 0
    *[tagged("2"), tagged("2"), tagged("3"), "junk"],  # R 2, 2, 1, 0
    *["junk", "junk", "junk", "junk"],  # R 0 x4: a flat group, yet equal to greedy
]
SAMPLE_REWARDS = np.array([2, 1, 1, 0, 2, 2, 1, 0, 0, 0, 0, 0], dtype=np.float64)
GREEDY_REWARDS = np.array([1, 2, 0], dtype=np.float64)
CONFIG = GRPOConfig(max_steps=1, batch_size=3, num_generations=G, baseline="greedy")


class FixedGreedy:
    """Stands in for the cluster's greedy decode (needs a model); records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def __call__(self, prompts: list[str]) -> list[str]:
        self.asked.append(list(prompts))
        return [GREEDY[PROMPTS.index(p)] for p in prompts]


def tunix_advantages(decode: FixedGreedy) -> tuple[np.ndarray, GreedyBaseline, dict]:
    """What Tunix 0.1.7's learner does with a step: repeat each prompt's row G times in a row
    (np.repeat), sum the reward terms in its reward manager, call the configured estimator."""
    fns = rewards.tunix_reward_fns(CONFIG.rewards)
    baseline = GreedyBaseline(fns, G, decode)
    algo = training.algorithm_config(CONFIG)
    manager = SequenceRewardManager([*fns, baseline], algo)
    info = manager(
        prompts=list(np.repeat(PROMPTS, G)),
        completions=SAMPLES,
        answer=np.repeat(ANSWERS, G),
        tests=np.repeat(["[]"] * 3, G),
        mode=str(rl_cluster.Mode.TRAIN),
    )
    estimator = function_registry.get_advantage_estimator(algo.advantage_estimator)
    return np.asarray(estimator(rewards=info["rewards"], num_generations=G)), baseline, info


def test_advantages_are_sample_minus_greedy_reward_per_prompt() -> None:
    decode = FixedGreedy()
    got, baseline, info = tunix_advantages(decode)
    np.testing.assert_array_equal(got, SAMPLE_REWARDS - np.repeat(GREEDY_REWARDS, G))
    assert decode.asked == [PROMPTS]  # one greedy decode per step, each prompt once, in order
    np.testing.assert_array_equal(baseline.rows(), np.repeat(GREEDY_REWARDS, G))
    # Tunix logs the baseline term under its name: minus the greedy reward, per row
    assert np.mean(info["log_metrics"][f"rewards/{NAME}"][0]) == -np.mean(baseline.rows())


def test_what_remax_pays_for() -> None:
    """Greedy wrong: the right sample earns +1 (answer), samples agreeing with the wrong mode
    0. Greedy right: a right sample earns 0, a wrong one -1. No group mean: a flat all-junk
    group whose greedy is junk too gets 0, and GRPO's group advantages differ."""
    got, _, _ = tunix_advantages(FixedGreedy())
    assert list(got[:4]) == [1.0, 0.0, 0.0, -1.0]
    assert list(got[4:8]) == [0.0, 0.0, -1.0, -2.0]
    assert list(got[8:]) == [0.0] * 4
    group = function_registry.get_advantage_estimator("grpo")
    assert not np.allclose(np.asarray(group(rewards=SAMPLE_REWARDS, num_generations=G)), got)


def test_rows_out_of_tunix_order_are_refused() -> None:
    with pytest.raises(ValueError, match="repeated num_generations=2 times in a row"):
        group_prompts(["a", "b", "a", "b"], 2)
    with pytest.raises(ValueError, match="do not split into groups"):
        group_prompts(["a", "a", "a"], 2)
    assert group_prompts(["a", "a", "b", "b"], 2) == ["a", "b"]


def test_the_recipe_field_selects_the_estimator_and_the_greedy_eval_rollout() -> None:
    algo = training.algorithm_config(CONFIG)
    assert algo.advantage_estimator == advantages.GREEDY_BASELINE
    found = function_registry.get_advantage_estimator(algo.advantage_estimator)
    assert found is advantages.greedy_baseline_advantages
    cluster = training._cluster_config(CONFIG, 16, "/tmp/c", "/tmp/l", (None, None), [1])
    configs = cluster.rollout_config
    assert isinstance(configs, dict)
    train, greedy = configs[rl_cluster.Mode.TRAIN], configs[rl_cluster.Mode.EVAL]
    assert (train.top_p, train.temperature) == (CONFIG.top_p, CONFIG.temperature)
    assert (greedy.top_p, greedy.top_k) == (None, None)  # Tunix's sampler: argmax
    assert greedy.max_tokens_to_generate == train.max_tokens_to_generate
    plain = GRPOConfig(max_steps=1, batch_size=3)
    assert not isinstance(
        training._cluster_config(plain, 16, "/tmp/c", "/tmp/l", (None, None), [1]).rollout_config,
        dict,
    )


def test_the_default_leaves_the_stage_hash_alone() -> None:
    assert "baseline" not in hashed_config("grpo", GRPOConfig(max_steps=1, batch_size=2))
    assert hashed_config("grpo", CONFIG)["baseline"] == "greedy"


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"flat_groups": "drop"}, "baseline: greedy cannot honour flat_groups: drop"),
        ({"algorithm": "dr-grpo", "beta": 0.0}, "baseline: greedy replaces GRPO's group"),
        ({"algorithm": "dapo", "beta": 0.0}, "baseline: greedy replaces GRPO's group"),
    ],
)
def test_far_validate_refuses_what_it_cannot_honour(changes: dict[str, object], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        GRPOConfig(max_steps=1, batch_size=2, baseline="greedy", **changes)
    with pytest.raises(RecipeError, match=f"grpo: .*{why}"):
        recipe_with("/tmp/unused", grpo={"baseline": "greedy", **changes})
    with pytest.raises(RecipeError, match=r"grpo\.baseline: Input should be 'group' or 'greedy'"):
        recipe_with("/tmp/unused", grpo={"baseline": "mean"})


def test_the_observer_logs_greedy_reward_and_moving_rows() -> None:
    decode = FixedGreedy()
    got, baseline, info = tunix_advantages(decode)
    observer = metrics.StepObserver(G, 5, lambda: 3, lambda step: 11, "tags", baseline)
    prompts = list(np.repeat(PROMPTS, G))
    out = observer(prompts, SAMPLES, info["rewards"], got)
    assert out[metrics.GREEDY_REWARD][0] == pytest.approx(GREEDY_REWARDS.mean())
    assert out[metrics.SAMPLE_REWARD][0] == pytest.approx(SAMPLE_REWARDS.mean())
    assert out[metrics.NONZERO_ADVANTAGE][0] == pytest.approx(4 / 12)  # +1, -1; -1, -2
    rows = observer.samples
    assert [r["reward"] for r in rows] == list(SAMPLE_REWARDS[:5])  # the sample's own reward
    assert [r["greedy_completion"] for r in rows] == [GREEDY[0]] * 4 + [GREEDY[1]]
    assert [r["greedy_reward"] for r in rows] == [1.0] * 4 + [2.0]
    history = metrics.MetricsHistory()
    history.values = {metrics.TOTAL_REWARD: [-0.5], metrics.SAMPLE_REWARD: [0.75]}
    assert history.latest_reward() == {"reward": 0.75}  # progress shows the samples' reward
