"""Where a GRPO step's time goes, phase by phase (stages/grpo/timing.py), on a recipe's model.

Runs data_prep, a short SFT and GRPO through FAR's stages and prints, from the GRPO record's
history, each step's seconds per phase and each phase's share of the timed time over the
steps after the first (the first one compiles).

    JAX_PLATFORMS=cpu .venv/bin/python bench/grpo_phases.py                       # smoke
    flock /tmp/far-heavy.lock env JAX_PLATFORMS=cpu .venv/bin/python bench/grpo_phases.py \
        --recipe demo --sft-steps 2 --grpo-steps 4                     # the real Gemma 3 270M
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.conftest.recipe_with: a recipe with fields replaced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument("--sft-steps", type=int, default=4)
    parser.add_argument("--grpo-steps", type=int, default=6)
    parser.add_argument("--cache-dir", default=os.environ.get("FAR_CACHE_DIR"))
    args = parser.parse_args()

    from schemas.record import StageRecord
    from stages import data_prep, grpo, sft
    from stages.core import storage
    from stages.core.runner import RunContext
    from stages.grpo import timing
    from tests.conftest import recipe_with

    with tempfile.TemporaryDirectory(prefix="far-grpo-phases-") as tmp:
        recipe = recipe_with(
            tmp, args.recipe, sft={"max_steps": args.sft_steps}, grpo={"max_steps": args.grpo_steps}
        )
        ctx = RunContext(tmp, "phases", cache_dir=args.cache_dir)
        dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
        policy = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output
        out = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)
        history = StageRecord.model_validate(storage.read_json(out.record_uri)).history
    phases = {k.removeprefix(timing.PREFIX): v for k, v in history.items() if timing.PREFIX in k}
    print(f"\n{args.recipe}: GRPO seconds per step and phase (load average {os.getloadavg()})")
    print("phase             " + " ".join(f"step {i:>3}" for i in range(args.grpo_steps)))
    for phase, values in phases.items():
        print(f"{phase:<17} " + " ".join(f"{v:8.3f}" for v in values))
    later = {phase: sum(values[1:]) for phase, values in phases.items()}
    total = sum(later.values())
    print(f"\nsteps 1-{args.grpo_steps - 1}: {total / (args.grpo_steps - 1):.2f} s a step timed")
    for phase, seconds in sorted(later.items(), key=lambda item: -item[1]):
        print(f"  {phase:<17} {100 * seconds / total:5.1f}%")


if __name__ == "__main__":
    main()
