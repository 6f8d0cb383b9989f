"""flat_groups: drop (stages/grpo/advantages.py): groups without reward spread leave GRPO's loss
denominator, so the informative groups' gradient is not diluted by how many groups are flat."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from tunix.rl import algo_core, function_registry

from schemas.recipe import GRPOConfig
from stages.grpo import advantages, training

# 4 groups of 4 completions: two flat (all 0, all 1), two with spread
REWARDS = np.array([0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1], dtype=np.float32)


def test_flat_groups_get_zero_and_the_informative_ones_are_scaled() -> None:
    plain = np.asarray(algo_core.compute_advantages(REWARDS, 4))
    dropped = advantages.informative_group_advantages(REWARDS, 4)
    assert np.all(dropped[:8] == 0)
    np.testing.assert_allclose(dropped[8:], plain[8:] * 2.0)  # 4 groups / 2 informative


def test_the_mean_over_all_completions_is_the_mean_over_informative_ones() -> None:
    """What the sequence-mean loss sees: any per-completion term x weighted by the dropped
    advantages, averaged over every completion, equals the plain advantages' average over
    the informative completions alone."""
    x = np.random.default_rng(0).normal(size=REWARDS.shape)
    plain = np.asarray(algo_core.compute_advantages(REWARDS, 4))
    dropped = advantages.informative_group_advantages(REWARDS, 4)
    np.testing.assert_allclose(np.mean(dropped * x), np.mean((plain * x)[8:]), rtol=1e-6)


def test_all_flat_is_all_zero() -> None:
    flat = np.array([1, 1, 0, 0], dtype=np.float32)
    assert np.all(advantages.informative_group_advantages(flat, 2) == 0)


def test_the_recipe_field_selects_the_registered_estimator() -> None:
    base = {"max_steps": 1, "batch_size": 2}
    config = training.algorithm_config(GRPOConfig(**base, flat_groups="drop"))
    assert config.advantage_estimator == advantages.INFORMATIVE_GROUPS
    found = function_registry.get_advantage_estimator(config.advantage_estimator)
    assert found is advantages.informative_group_advantages
    assert training.algorithm_config(GRPOConfig(**base)).advantage_estimator == "grpo"
    with pytest.raises(ValidationError, match="flat_groups: drop rescales"):
        GRPOConfig(**base, flat_groups="drop", algorithm="dr-grpo", beta=0.0)
