"""Optimizers for the training stages (SFT and GRPO): AdamW with an optional warmup-cosine
schedule, betas, decoupled weight decay and global-norm gradient clipping (the learning rate
stays visible to Tunix's metrics through optax.inject_hyperparams)."""

from __future__ import annotations

import optax

from schemas.recipe import GRPOConfig

FINAL_LR_FRACTION = 0.1  # the cosine decays to 10% of the peak


def learning_rate_schedule(
    peak: float, schedule: str, warmup_steps: int, total_steps: int
) -> optax.Schedule:
    if schedule == "constant":
        return optax.constant_schedule(peak)
    if schedule == "warmup_cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0 if warmup_steps else peak,
            peak_value=peak,
            warmup_steps=warmup_steps,
            decay_steps=max(total_steps, warmup_steps + 1),
            end_value=peak * FINAL_LR_FRACTION,
        )
    raise ValueError(f"unknown schedule {schedule!r}; expected 'constant' or 'warmup_cosine'")


def adamw(
    peak_lr: float,
    schedule: str = "constant",
    warmup_steps: int = 0,
    total_steps: int = 1,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
    b1: float = 0.9,
    b2: float = 0.999,
) -> optax.GradientTransformation:
    """Clipping sits inside inject_hyperparams so the outer state carries `learning_rate`,
    where Tunix's trainer looks for it when logging."""

    def build(
        learning_rate: optax.ScalarOrSchedule, weight_decay: float
    ) -> optax.GradientTransformation:
        update = optax.adamw(learning_rate, b1=b1, b2=b2, weight_decay=weight_decay)
        if max_grad_norm is None:
            return update
        return optax.chain(optax.clip_by_global_norm(max_grad_norm), update)

    lr = learning_rate_schedule(peak_lr, schedule, warmup_steps, total_steps)
    return optax.inject_hyperparams(build)(learning_rate=lr, weight_decay=weight_decay)


def grpo_adamw(config: GRPOConfig) -> optax.GradientTransformation:
    """GRPO's optimizer from the recipe; its schedule counts optimizer updates
    (num_iterations per GRPO step), the unit Tunix's trainer steps in."""
    updates = config.max_steps * config.num_iterations
    return adamw(
        config.learning_rate,
        config.lr_schedule,
        warmup_steps=round(config.warmup_fraction * updates),
        total_steps=updates,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        b1=config.adam_b1,
        b2=config.adam_b2,
    )
