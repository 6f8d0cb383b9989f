"""Run the SFT stage of a small recipe in its own process (tests kill it with SIGKILL).

usage: python -m tests.integration._sft_child ROOT MAX_STEPS [DEADLINE_SECONDS] [--die-in-save STEP]
    [--checkpoint-every STEPS] [--die-before-record]

--die-in-save STEP is fault injection: the process SIGKILLs itself after Orbax has written
checkpoint STEP into its temporary directory and before the rename that commits it, the
torn save a preemption during a checkpoint write leaves behind. --checkpoint-every replaces the
recipe's cadence of 5 (every session of one run must pass the same: it is in the stage's hash).
--die-before-record: the process SIGKILLs itself once SFT saved and published its final
checkpoint, just before it writes the stage's record (a kill between the two).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from stages import sft
from stages.core.runner import RunContext, SessionExpired
from stages.data_prep import build as data_prep
from tests.conftest import recipe_with, use_session_compile_cache

EXIT_SESSION_ENDED = 3


def child_recipe(root: str, max_steps: int, checkpoint_every: int = 5) -> object:
    return recipe_with(
        root,
        sft={
            "max_steps": max_steps,
            "checkpoint_every_steps": checkpoint_every,
            "save_margin_seconds": 0.5,
        },
    )


def die_in_save(step: int) -> None:
    from orbax.checkpoint._src.path import atomicity

    original = atomicity.AtomicRenameTemporaryPath.finalize

    async def finalize(self: Any) -> None:
        if self._final_path.name == str(step):
            print(f"KILLING MYSELF while saving step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        await original(self)

    atomicity.AtomicRenameTemporaryPath.finalize = finalize  # type: ignore[method-assign]


def die_before_record() -> None:
    from stages.core import runner

    original = runner.commit_record

    def commit(ctx: Any, record_uri: str, record: Any) -> None:
        if record.stage == "sft":
            print("KILLING MYSELF before the SFT record", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        original(ctx, record_uri, record)

    runner.commit_record = commit


def main(argv: list[str]) -> int:
    use_session_compile_cache()
    if "--die-before-record" in argv:
        argv = [a for a in argv if a != "--die-before-record"]
        die_before_record()
    if "--die-in-save" in argv:
        at = argv.index("--die-in-save")
        die_in_save(int(argv[at + 1]))
        argv = argv[:at] + argv[at + 2 :]
    checkpoint_every = 5
    if "--checkpoint-every" in argv:
        at = argv.index("--checkpoint-every")
        checkpoint_every = int(argv[at + 1])
        argv = argv[:at] + argv[at + 2 :]
    root, max_steps = argv[0], int(argv[1])
    deadline = time.time() + float(argv[2]) if len(argv) > 2 else None
    recipe = child_recipe(root, max_steps, checkpoint_every)
    ctx = RunContext(root=root, run="child", deadline=deadline)
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output  # type: ignore[attr-defined]
    try:
        out = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx)  # type: ignore[attr-defined]
    except SessionExpired as e:
        print(f"SESSION ENDED: {e}", flush=True)
        return EXIT_SESSION_ENDED
    print(f"RECORD {out.record_uri}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
