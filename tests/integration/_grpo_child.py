"""Run GRPO of a small recipe in its own process (tests kill it with SIGKILL), starting from
a committed data-prep and SFT run of the same recipe that the test's children share.

usage: python -m tests.integration._grpo_child ROOT DATA_PREP_RECORD SFT_RECORD
"""

from __future__ import annotations

import sys
from typing import Any

from schemas.record import StageRecord
from stages.core import storage
from stages.core.runner import RunContext
from stages.grpo import training as grpo
from tests.conftest import recipe_with, use_session_compile_cache

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
    use_session_compile_cache()
    root, records = argv[0], argv[1:]
    recipe: Any = child_recipe(root)
    ctx = RunContext(root=root, run="child")
    dataset, policy = (StageRecord.model_validate(storage.read_json(u)).output for u in records)
    out = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)  # type: ignore[arg-type]
    print(f"RECORD {out.record_uri}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
