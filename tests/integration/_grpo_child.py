"""Run SFT then GRPO of a small recipe in its own process (tests kill it with SIGKILL).

usage: python -m tests.integration._grpo_child ROOT
"""

from __future__ import annotations

import sys

from stages import data_prep, grpo, sft
from stages.core.runner import RunContext
from tests.conftest import recipe_with

GRPO_STEPS = 6


def child_recipe(root: str) -> object:
    # format_approx gives partial credit, so some groups have reward variance from the start
    return recipe_with(
        root,
        sft={"max_steps": 20},
        grpo={
            "max_steps": GRPO_STEPS,
            "checkpoint_every_steps": 1,
            "rewards": {"format_approx": 1.0, "format_strict": 1.0, "answer_match": 1.0},
        },
    )


def main(argv: list[str]) -> int:
    root = argv[0]
    recipe = child_recipe(root)
    ctx = RunContext(root=root, run="child")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output  # type: ignore[attr-defined]
    policy = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output  # type: ignore[attr-defined]
    out = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)  # type: ignore[attr-defined]
    print(f"RECORD {out.record_uri}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
