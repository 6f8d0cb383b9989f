"""GRPO rollout seeds that change every step and survive a resume.

Tunix 0.1.7 samples every GRPO step with the same PRNG key; FAR's rollout engine
(tunix_compat.SeededRollout) asks `step_seed` for each generate call instead. The seed is a
function of the recipe seed, the cluster's global step and the call's index within that
step. The global step is restored on resume, so a resumed run draws exactly the seeds an
uninterrupted run draws.
"""

from __future__ import annotations

import numpy as np


def step_seed(base_seed: int, step: int, call: int) -> int:
    """A 31-bit seed from (recipe seed, global step, call within the step); stable across runs."""
    entropy = [base_seed & 0xFFFFFFFF, step, call]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] >> 1)
