"""Child of test_tunix_progress_bar.py: Tunix's PeftTrainer trains a 2x1 linear model for 3
steps on a terminal, with its own progress bar, or with it hidden (argv[1] == "hide")."""

from __future__ import annotations

import sys

import jax.numpy as jnp
import optax
from flax import nnx
from tunix.sft import peft_trainer

from stages.modeling import tunix_compat

model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
config = peft_trainer.TrainingConfig(
    eval_every_n_steps=100, max_steps=3, pbar_description="TUNIXBAR"
)
trainer = peft_trainer.PeftTrainer(model, optax.sgd(0.1), config)
trainer = trainer.with_loss_fn(lambda m, x, y: jnp.mean((m(x) - y) ** 2))
if sys.argv[1] == "hide":
    tunix_compat.hide_progress_bar(trainer)
trainer.train([{"x": jnp.ones((4, 2)), "y": jnp.zeros((4, 1))}] * 3)
print(f"trained {trainer.train_steps} steps", file=sys.stderr)
