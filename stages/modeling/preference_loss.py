"""DPO and ORPO losses on per-token averaged sequence log-probs, for Tunix's DPOTrainer.

Tunix 0.1.7's `dpo_loss_fn` sums a response's token log-probs into its sequence log-prob, so
ORPO's odds ratio compares whole-sequence probabilities: a long right chain has a tiny
probability whatever its tokens' confidence, and log1p(-exp(x)) sits near 0 for both sides.
TRL's ORPO, and Tunix's later releases, average them over the response's tokens. This module
is that averaged form, given to the trainer through its public `with_loss_fn` when a dpo
node sets `logprobs: mean` (the default `sum` leaves Tunix's own loss in place). It is FAR's
loss, not a patch of Tunix's: the per-token log-probs still come from Tunix's
`compute_logps`, and the formulas are Tunix's with the averaged values in them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from tunix.sft.dpo import dpo_trainer


def averaged(summed: jax.Array, mask: jax.Array) -> jax.Array:
    """Each row's summed log-prob over its response's tokens (mask 1), per token."""
    return summed / jnp.maximum(mask.sum(axis=-1), 1.0)


def orpo_terms(
    chosen: jax.Array, rejected: jax.Array, lambda_orpo: float, label_smoothing: float = 0.0
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """ORPO on averaged log-probs: -chosen (the NLL per token) + lambda x -log sigmoid of the
    log odds ratio; per pair, with Tunix's logged metrics."""
    log_odds = (chosen - rejected) - (jnp.log1p(-jnp.exp(chosen)) - jnp.log1p(-jnp.exp(rejected)))
    or_loss = -(
        jax.nn.log_sigmoid(log_odds) * (1 - label_smoothing)
        + jax.nn.log_sigmoid(-log_odds) * label_smoothing
    )
    sft_loss = -chosen
    chosen_rewards, rejected_rewards = lambda_orpo * chosen, lambda_orpo * rejected
    aux = {
        **_reward_metrics(chosen_rewards, rejected_rewards, chosen, rejected),
        "odds_ratio": jnp.exp(log_odds).mean(),
        "sft_loss": sft_loss.mean(),
        "or_loss": or_loss.mean(),
    }
    return sft_loss + lambda_orpo * or_loss, aux


def dpo_terms(
    chosen_ratio: jax.Array,
    rejected_ratio: jax.Array,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, jax.Array]:
    """DPO's per-pair loss on the (averaged) log-ratios to the reference, and its rewards."""
    delta = chosen_ratio - rejected_ratio
    losses = -(
        jax.nn.log_sigmoid(beta * delta) * (1 - label_smoothing)
        + jax.nn.log_sigmoid(-beta * delta) * label_smoothing
    )
    return losses, jnp.stack([beta * chosen_ratio, beta * rejected_ratio])


def _reward_metrics(
    chosen_rewards: jax.Array, rejected_rewards: jax.Array, chosen: jax.Array, rejected: jax.Array
) -> dict[str, jax.Array]:
    return {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/margin": (chosen_rewards - rejected_rewards).mean(),
        "rewards/accuracy": (chosen_rewards > rejected_rewards).mean(),
        "log_probs/chosen": chosen.mean(),
        "log_probs/rejected": rejected.mean(),
    }


def averaged_loss_fn(
    model: Any,
    train_example: dpo_trainer.TrainExample,
    algorithm: str = "dpo",
    beta: float = 0.1,
    lambda_orpo: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Tunix's `dpo_loss_fn` with each response's log-prob averaged over its tokens (the
    chosen rows first, then the rejected, as Tunix batches them)."""
    example = train_example
    chosen_sum, rejected_sum = dpo_trainer.compute_logps(
        model,
        example.input_ids,
        example.positions,
        example.attention_mask,
        example.logits_to_keep,
        example.completion_mask,
        images=example.images,
    )
    half = example.completion_mask.shape[0] // 2
    chosen_mask, rejected_mask = example.completion_mask[:half], example.completion_mask[half:]
    chosen, rejected = averaged(chosen_sum, chosen_mask), averaged(rejected_sum, rejected_mask)
    if algorithm == "orpo":
        losses, aux = orpo_terms(chosen, rejected, lambda_orpo, label_smoothing)
        return losses.mean(), aux
    chosen_ratio, rejected_ratio = chosen, rejected
    if example.ref_chosen_logps is not None:
        chosen_ratio = chosen - averaged(example.ref_chosen_logps, chosen_mask)
    if example.ref_rejected_logps is not None:
        rejected_ratio = rejected - averaged(example.ref_rejected_logps, rejected_mask)
    losses, (chosen_rewards, rejected_rewards) = dpo_terms(
        chosen_ratio, rejected_ratio, beta, label_smoothing
    )
    return losses.mean(), _reward_metrics(chosen_rewards, rejected_rewards, chosen, rejected)
