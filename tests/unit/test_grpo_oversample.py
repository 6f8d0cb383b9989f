"""grpo.oversample (advantages.oversampled_groups): a step rolls out oversample x batch_size
prompts and the actor update keeps batch_size groups, those with reward spread first. The
kept example must be the one GRPO would have built had only those groups been sampled: the
same rows and the advantages Tunix's estimator gives their own rewards. The stage's wiring
(one rollout of every prompt, one update a step, the kept share logged) runs on the tiny
model in tests/integration/test_grpo_full.py (the unfiltered run of the difficulty test)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from tunix.rl import algo_core
from tunix.rl import common as rl_common

from schemas.artifacts import DatasetArtifact
from schemas.recipe import GRPOConfig
from stages.core.errors import InputError
from stages.grpo import advantages, metrics, training
from tests.conftest import recipe_with

G = 2  # completions a group
# rewards of six groups: spread in groups 1, 2, 4 and 5; groups 0 and 3 flat
REWARDS = np.asarray([1, 1, 0, 1, 1, 0, 0, 0, 0, 1, 2, 0], np.float32)
INFORMATIVE = [1, 2, 4, 5]


def example_of(rewards: np.ndarray, estimator: Any) -> rl_common.TrainExample:
    """A step's example whose row i carries token i + 2 and the estimator's advantages."""
    ids = np.arange(len(rewards), dtype=np.int32)[:, None] + 2
    return rl_common.TrainExample(
        prompt_ids=jnp.asarray(ids),
        prompt_mask=jnp.asarray(ids > 0),
        completion_ids=jnp.asarray(ids),
        completion_mask=jnp.asarray(ids > 0),
        advantages=jnp.asarray(estimator(rewards, G)),
        ref_per_token_logps=None,
        old_per_token_logps=jnp.asarray(ids, jnp.float32),
    )


ESTIMATORS = {
    "drop": advantages.informative_group_advantages,
    "count": lambda rewards, g: np.asarray(algo_core.compute_advantages(rewards, g)),
}


@pytest.mark.parametrize("flat_groups", ["drop", "count"])
@pytest.mark.parametrize(
    ("keep", "groups"),
    [
        (2, [1, 2]),  # more informative groups than kept: the first ones
        (4, INFORMATIVE),  # exactly enough
        (5, [0, 1, 2, 4, 5]),  # too few: the first flat group fills, in order
        (6, [0, 1, 2, 3, 4, 5]),  # all
    ],
)
def test_the_kept_groups_are_the_example_grpo_builds_from_them_alone(
    flat_groups: str, keep: int, groups: list[int]
) -> None:
    estimator = ESTIMATORS[flat_groups]
    full = example_of(REWARDS, estimator)
    kept, share = advantages.oversampled_groups(full, G, keep, flat_groups == "drop")
    rows = advantages.group_rows(np.asarray(groups), G)
    alone = example_of(REWARDS[rows], estimator)
    np.testing.assert_array_equal(kept.prompt_ids, full.prompt_ids[rows])
    np.testing.assert_array_equal(kept.old_per_token_logps, full.old_per_token_logps[rows])
    np.testing.assert_allclose(kept.advantages, alone.advantages, rtol=1e-6)
    assert share == len(set(groups) & set(INFORMATIVE)) / keep
    assert kept.ref_per_token_logps is None


def test_a_rollout_without_spread_keeps_the_first_groups_at_zero() -> None:
    flat = example_of(np.ones(8, np.float32), ESTIMATORS["drop"])
    kept, share = advantages.oversampled_groups(flat, G, 2, drop_flat=True)
    np.testing.assert_array_equal(kept.prompt_ids[:, 0], [2, 3, 4, 5])
    assert share == 0.0 and not np.any(kept.advantages)


def test_the_stage_keeps_batch_size_groups_then_skips_the_flat_ones() -> None:
    """oversample first, then skip_flat_groups on the kept groups; the kept share is logged."""
    config = GRPOConfig(
        max_steps=1,
        batch_size=4,
        num_generations=G,
        beta=0.0,
        oversample=2,
        flat_groups="drop",
        skip_flat_groups=True,
    )
    logged: list[dict[str, float]] = []
    transform = training.example_transform(config, logged.append)
    assert transform is not None
    rewards = np.concatenate([REWARDS, np.zeros(4, np.float32)])  # 8 groups, 4 informative
    out = transform(example_of(rewards, ESTIMATORS["drop"]))
    rows = advantages.group_rows(np.asarray(INFORMATIVE), G)
    np.testing.assert_array_equal(out.prompt_ids[:, 0], rows + 2)
    assert logged == [{metrics.UPDATE_INFORMATIVE: 1.0}]
    assert training.rolled_out(config) == 8


def test_the_recipe_refuses_oversample_where_it_cannot_keep_groups() -> None:
    base: dict[str, Any] = {"max_steps": 1, "batch_size": 4, "oversample": 2}
    assert GRPOConfig(**base).oversample == 2
    with pytest.raises(ValueError, match="algorithm is 'dapo'"):
        GRPOConfig(**base, algorithm="dapo", beta=0.0)
    with pytest.raises(ValueError, match="oversample needs one micro-batch a step"):
        GRPOConfig(**base, train_micro_batch_size=2)
    with pytest.raises(ValueError, match="less than or equal to 8"):
        GRPOConfig(**{**base, "oversample": 9})
    grpo = {"batch_size": 4, "oversample": 2}
    with pytest.raises(ValueError, match=r"4 x 2 > 6"):
        recipe_with("/tmp/unused", grpo=grpo, data={"grpo": {"size": 6}})


def test_a_pool_smaller_than_a_step_is_refused_before_compute() -> None:
    """Before, a pool smaller than batch_size made the prompt stream loop without yielding."""
    dataset = DatasetArtifact.model_construct(uri="memory://d", split_sizes={"grpo_train": 6})
    training.check_pool(dataset, GRPOConfig(max_steps=1, batch_size=3, oversample=2))
    with pytest.raises(InputError, match="6 grpo_train prompts, fewer than one GRPO step"):
        training.check_pool(dataset, GRPOConfig(max_steps=1, batch_size=4, oversample=2))
    with pytest.raises(InputError, match="0 grpo_train prompts"):
        empty = DatasetArtifact.model_construct(uri="memory://e", split_sizes={})
        training.check_pool(empty, GRPOConfig(max_steps=1, batch_size=1))
