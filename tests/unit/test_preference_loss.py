"""ORPO and DPO on per-token averaged log-probs (dpo `logprobs: mean`): the loss of a tiny
batch against a hand computation of the same formulas, the summed form (Tunix 0.1.7's own
loss) against the hand computation on sums, and the option out of the stage hash at its
default."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.sft.dpo import dpo_trainer

from schemas.recipe import DPOConfig
from stages.modeling import preference_loss
from stages.registry import hashed_config

VOCAB = 5


class Table(nnx.Module):
    """A real (tiny) model: each token's next-token logits are a row of one table."""

    def __init__(self) -> None:
        rows = np.linspace(-1.5, 2.0, VOCAB * VOCAB).reshape(VOCAB, VOCAB)
        self.logits = nnx.Param(jnp.asarray(np.sin(rows * 3.0) * 2.0, jnp.float32))

    def __call__(self, tokens, positions=None, attention_mask=None, cache=None):  # type: ignore[no-untyped-def]
        return self.logits.value[tokens], None


# 2 pairs: rows 0-1 chosen, rows 2-3 rejected; prompt 2 tokens, responses up to 3 tokens
PROMPT = [[1, 2], [3, 4]]
RESPONSES = [[4, 0, 3], [2, 1, 0], [0, 3, 1], [1, 1, 4]]
MASK = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]]


def example(ref: tuple[list[float], list[float]] | None = None) -> dpo_trainer.TrainExample:
    ids = jnp.asarray([PROMPT[i % 2] + r for i, r in enumerate(RESPONSES)], jnp.int32)
    n = ids.shape[1]
    return dpo_trainer.TrainExample(
        input_ids=ids,
        positions=jnp.tile(jnp.arange(n), (4, 1)),
        attention_mask=jnp.ones((4, n, n), jnp.int32),
        ref_chosen_logps=None if ref is None else jnp.asarray(ref[0]),
        ref_rejected_logps=None if ref is None else jnp.asarray(ref[1]),
        completion_mask=jnp.asarray(MASK, jnp.float32),
        logits_to_keep=3,
    )


def hand_logps(model: Table) -> tuple[list[float], list[float]]:
    """(summed, averaged) response log-probs, row by row, in plain Python."""
    table = np.asarray(model.logits.value, np.float64)
    sums, means = [], []
    for i, response in enumerate(RESPONSES):
        tokens = PROMPT[i % 2] + response
        total = 0.0
        for t in range(3):
            if MASK[i][t]:
                row = table[tokens[1 + t]]  # the logits after the token before it
                total += row[tokens[2 + t]] - math.log(sum(math.exp(x) for x in row))
        sums.append(total)
        means.append(total / sum(MASK[i]))
    return sums, means


def test_orpo_on_averaged_log_probs_is_the_hand_computation() -> None:
    model = Table()
    sums, means = hand_logps(model)
    loss, aux = preference_loss.averaged_loss_fn(model, example(), "orpo", lambda_orpo=0.5)
    # the NLL term is per token in both forms (Tunix divides the sum by the length)
    assert float(aux["sft_loss"]) == pytest.approx(-sum(means[:2]) / 2, rel=1e-5)
    by_hand = 0.0
    for c, r in zip(means[:2], means[2:], strict=True):
        ratio = (c - math.log(1 - math.exp(c))) - (r - math.log(1 - math.exp(r)))
        by_hand += (-c + 0.5 * math.log(1 + math.exp(-ratio))) / 2
    assert float(loss) == pytest.approx(by_hand, rel=1e-5)
    assert float(aux["log_probs/chosen"]) == pytest.approx(sum(means[:2]) / 2, rel=1e-5)
    # Tunix 0.1.7's own loss is the same formula on the sums: a different number here
    summed, _ = dpo_trainer.dpo_loss_fn(model, example(), "orpo", lambda_orpo=0.5)
    on_sums = 0.0
    for (c, r), n in zip(zip(sums[:2], sums[2:], strict=True), (3, 2), strict=True):
        ratio = (c - math.log(1 - math.exp(c))) - (r - math.log(1 - math.exp(r)))
        on_sums += (-c / n + 0.5 * math.log(1 + math.exp(-ratio))) / 2
    assert float(summed) == pytest.approx(on_sums, rel=1e-5)
    assert abs(float(summed) - float(loss)) > 1e-3


def test_dpo_on_averaged_log_probs_averages_the_reference_too() -> None:
    model = Table()
    _, means = hand_logps(model)
    ref = ([-2.0, -1.0], [-0.5, -3.0])  # summed, as Tunix's reference pass gives them
    loss, _ = preference_loss.averaged_loss_fn(model, example(ref), "dpo", beta=0.1)
    by_hand = 0.0
    for i in range(2):
        chosen = means[i] - ref[0][i] / (3, 2)[i]
        rejected = means[2 + i] - ref[1][i] / (1, 3)[i]
        by_hand += math.log(1 + math.exp(-0.1 * (chosen - rejected))) / 2
    assert float(loss) == pytest.approx(by_hand, rel=1e-5)


def test_the_default_keeps_tunix_s_sums_and_the_hash() -> None:
    config = DPOConfig(max_steps=2)
    assert config.logprobs == "sum"
    assert "logprobs" not in hashed_config("dpo", config)
    assert (
        hashed_config("dpo", config.model_copy(update={"logprobs": "mean"}))["logprobs"] == "mean"
    )
