"""GRPO rollouts with a sampling seed that changes every step and survives a resume.

Tunix 0.1.7 passes RolloutConfig.seed unchanged to every generate call, so every GRPO step
samples with the same PRNG key (and seed None means PRNGKey(0) every time): two steps on
the same prompt draw the same random numbers. `SeededRollout` is Tunix's vanilla engine
with one change: each generate call samples with a seed derived from the recipe seed, the
cluster's global step and the call's index within that step. The global step is restored on
resume, so a resumed run draws exactly the seeds an uninterrupted run draws.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from tunix.rl.rollout import base_rollout, vanilla_rollout


def step_seed(base_seed: int, step: int, call: int) -> int:
    """A 31-bit seed from (recipe seed, global step, call within the step); stable across runs."""
    entropy = [base_seed & 0xFFFFFFFF, step, call]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] >> 1)


class SeededRollout(vanilla_rollout.VanillaRollout):
    """Vanilla rollout whose sampling seed follows the global step (see module docstring).

    Built by RLCluster (rollout_engine=functools.partial(SeededRollout, base_seed=...,
    kv_cache_size=...)); `follow(step_of)` must then bind the step counter.
    """

    def __init__(
        self, rollout_actor: Any, tokenizer: Any, mesh: Any,
        rollout_config: base_rollout.RolloutConfig, *, base_seed: int,
    ) -> None:  # fmt: skip
        config = rollout_actor.config
        cache = base_rollout.CacheConfig(
            cache_size=rollout_config.kv_cache_size, num_layers=config.num_layers,
            num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
        )  # fmt: skip
        super().__init__(rollout_actor, tokenizer, cache_config_or_size=cache)
        self.base_seed = base_seed
        self.seeds_used: list[tuple[int, int]] = []  # (global step, seed) per generate call
        self._step_of: Callable[[], int] | None = None

    def follow(self, step_of: Callable[[], int]) -> None:
        """Read the global step from `step_of` (the cluster's counter) at each generate call."""
        self._step_of = step_of

    def next_seed(self) -> int:
        if self._step_of is None:
            raise RuntimeError("SeededRollout.follow(step_of) was not called before generating")
        step = self._step_of()
        call = sum(1 for s, _ in self.seeds_used if s == step)
        seed = step_seed(self.base_seed, step, call)
        self.seeds_used.append((step, seed))
        return seed

    def generate(
        self, prompts: list[str], rollout_config: base_rollout.RolloutConfig, **kwargs: Any
    ) -> base_rollout.RolloutOutput:
        seeded = dataclasses.replace(rollout_config, seed=jax.random.PRNGKey(self.next_seed()))
        return super().generate(prompts, seeded, **kwargs)
