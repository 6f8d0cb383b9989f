"""Run the SFT stage of a small recipe in its own process (tests kill it with SIGKILL).

usage: python -m tests.integration._sft_child ROOT MAX_STEPS [DEADLINE_SECONDS] [--die-in-save STEP]
    [--checkpoint-every STEPS] [--die-before-record] [--pace SECONDS]

--die-in-save STEP is fault injection: the process SIGKILLs itself after Orbax has written
checkpoint STEP into its temporary directory and before the rename that commits it, the
torn save a preemption during a checkpoint write leaves behind. --checkpoint-every replaces the
recipe's cadence of 5 (every session of one run must pass the same: it is in the stage's hash).
--die-before-record: the process SIGKILLs itself once SFT saved and published its final
checkpoint, just before it writes the stage's record (a kill between the two).
--pace SECONDS: SFT's batch stream sleeps that long before every batch (`pace_sft`), so that
a deadline falls mid-training after a few steps instead of hundreds (a sleep costs no CPU).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
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


def paced_stream(seconds: float) -> Callable[[Any], Iterator[Any]]:
    """SFT's batch stream (stages.sft.in_memory_stream), sleeping `seconds` before each batch.

    Test-only pacing: a wall-clock deadline or a stop request then lands mid-training with a
    few steps of compute instead of hundreds. The batches and their order are unchanged, so
    a paced session trains exactly what an unpaced one does; the sleep lies inside the
    step time the session's deadline guard measures, as a slow step's would."""
    stream = sft.in_memory_stream

    def paced(dataset: Any) -> Iterator[Any]:
        for item in stream(dataset):
            time.sleep(seconds)
            yield item

    return paced


def pace_sft(seconds: float) -> None:
    """Pace this process's SFT stages (`paced_stream`); tests in-process use monkeypatch."""
    sft.in_memory_stream = paced_stream(seconds)


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
    if "--pace" in argv:
        at = argv.index("--pace")
        pace_sft(float(argv[at + 1]))
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
