"""The GRPO algorithm and optimizer come from the recipe: each algorithm maps to Tunix's own
learner and config, DAPO's knobs are refused elsewhere, the optimizer follows the schedule."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import optax
import pytest
from pydantic import ValidationError
from tunix.rl.grpo import dapo_learner, drgrpo_learner, grpo_learner

from schemas.recipe import GRPOConfig
from stages.grpo import training as grpo
from stages.modeling import optim


def config(**fields: Any) -> GRPOConfig:
    return GRPOConfig(max_steps=10, batch_size=2, **fields)


def test_defaults_are_tunix_grpo_examples() -> None:
    c = config()
    assert (c.learning_rate, c.adam_b1, c.adam_b2, c.weight_decay) == (3e-6, 0.9, 0.99, 0.1)
    assert (c.lr_schedule, c.warmup_fraction, c.max_grad_norm) == ("warmup_cosine", 0.1, 0.1)


@pytest.mark.parametrize(
    ("fields", "learner", "algo_class"),
    [
        ({}, grpo_learner.GRPOLearner, grpo_learner.GRPOConfig),
        ({"algorithm": "gspo-token"}, grpo_learner.GRPOLearner, grpo_learner.GRPOConfig),
        ({"algorithm": "dapo", "beta": 0.0}, dapo_learner.DAPOLearner, dapo_learner.DAPOConfig),
        ({"algorithm": "dr-grpo"}, drgrpo_learner.DrGRPOLearner, drgrpo_learner.DrGRPOConfig),
    ],
)
def test_each_algorithm_uses_tunix_learner(
    fields: dict[str, Any], learner: type, algo_class: type
) -> None:
    c = config(**fields)
    algo = grpo.algorithm_config(c)
    assert type(algo) is algo_class and grpo._LEARNERS[c.algorithm] is learner
    assert (algo.num_generations, algo.epsilon) == (c.num_generations, c.epsilon)


def test_algorithm_specifics_reach_tunix() -> None:
    assert grpo.algorithm_config(config(algorithm="gspo-token")).loss_algo == "gspo-token"
    assert grpo.algorithm_config(config(algorithm="dr-grpo")).advantage_estimator == "drgrpo"
    dapo = grpo.algorithm_config(
        config(
            algorithm="dapo",
            beta=0.0,
            epsilon_high=0.28,
            overlong_penalty={"buffer_chars": 16, "max_chars": 64, "penalty": 0.5},
        )
    )
    assert dapo.beta is None and dapo.epsilon_high == 0.28  # type: ignore[attr-defined]
    assert dapo.overlong_buffer == {  # type: ignore[attr-defined]
        "enable": True,
        "overlong_buffer_length": 16,
        "overlong_buffer_penalty": 0.5,
        "max_response_length": 64,
    }
    plain = grpo.algorithm_config(config(algorithm="dapo", beta=0.0))
    assert plain.epsilon_high == plain.epsilon and plain.overlong_buffer is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"epsilon_high": 0.3}, "epsilon_high is a DAPO knob"),
        (
            {"overlong_penalty": {"buffer_chars": 4, "max_chars": 8}},
            "overlong_penalty is a DAPO knob",
        ),
        ({"algorithm": "dapo"}, "dapo has no KL term: set beta: 0 (got beta=0.04)"),
        ({"algorithm": "dapo", "beta": 0, "epsilon_high": 0.1}, "epsilon_high must be >="),
        (
            {
                "algorithm": "dapo",
                "beta": 0,
                "overlong_penalty": {"buffer_chars": 8, "max_chars": 8},
            },
            "buffer_chars must be < max_chars",
        ),
        ({"algorithm": "ppo"}, "algorithm"),
    ],
)
def test_invalid_algorithm_settings_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(**fields)


def learning_rates(transform: optax.GradientTransformation, steps: int) -> list[float]:
    params = {"w": np.ones(3, np.float32)}
    state = transform.init(params)
    seen = []
    for _ in range(steps):
        seen.append(float(state.hyperparams["learning_rate"]))  # type: ignore[attr-defined]
        _, state = transform.update({"w": np.ones(3, np.float32)}, state, params)
    return seen


def test_grpo_optimizer_warms_up_then_decays_over_optimizer_updates() -> None:
    # 10 steps x 2 iterations = 20 updates: 2 warmup updates, cosine to 10% of the peak
    # (the state carries the rate of the update just applied: rates[k + 1] is update k's)
    rates = learning_rates(optim.grpo_adamw(config(learning_rate=1e-3, num_iterations=2)), 22)
    assert rates[1] == 0.0 and rates[3] == pytest.approx(1e-3)
    assert rates[21] == pytest.approx(1e-4)
    assert all(a >= b for a, b in itertools.pairwise(rates[3:]))
    flat = learning_rates(optim.grpo_adamw(config(lr_schedule="constant")), 3)
    assert flat == pytest.approx([3e-6] * 3)


def test_grpo_optimizer_clips_the_update() -> None:
    params = {"w": np.zeros(4, np.float32)}
    big = {"w": np.full(4, 100.0, np.float32)}
    # Adam's first update is lr * sign-like regardless of scale; the clip shows through the
    # second moment: clipped and unclipped runs differ once gradients change scale.
    clipped, free = (
        optim.grpo_adamw(config(learning_rate=1e-2, lr_schedule="constant", max_grad_norm=m))
        for m in (0.1, None)
    )
    outs = []
    for transform in (clipped, free):
        state = transform.init(params)
        _, state = transform.update(big, state, params)
        update, _ = transform.update({"w": np.full(4, 0.01, np.float32)}, state, params)
        outs.append(np.asarray(update["w"]))
    assert not np.allclose(outs[0], outs[1])
