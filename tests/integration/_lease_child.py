"""Hold or contend for a run's lease in its own process (tests kill the holder with SIGKILL).

usage: python -m tests.integration._lease_child RUN_URI hold TTL_SECONDS
       python -m tests.integration._lease_child RUN_URI take WAIT_SECONDS
       python -m tests.integration._lease_child RUN_URI work TTL_SECONDS
       python -m tests.integration._lease_child RUN_URI sft TTL_SECONDS [STOP_BEFORE_SAVE]

hold: takes the lease (heartbeat every TTL/3), prints "held" and sleeps until killed.
take: takes the lease waiting up to WAIT_SECONDS, prints the holder it took over from (JSON,
or null) and releases it; exits 4 with the LeaseHeld message if a live holder kept it.
work: holds the lease as `far run` does (flows/far_flow.py: the heartbeat aborts the session's
StopFlag, SIGTERM stops it), prints "held", then computes for WORK_SECONDS in the main thread
without looking at the flag (as a step, a generation or grading does), then commits behind the
lease's fence and prints "committed"; exits 5 with the LeaseLost message once it lost the lease.
sft: holds the lease as `far run` does and runs the small recipe's data_prep and SFT stages
behind its fence (RunContext.fence), printing "held", then "RECORD <uri>" once SFT committed;
exits 5 with the LeaseLost message once it lost the lease. With STOP_BEFORE_SAVE (a step), it
stops itself with SIGSTOP just before the trainer saves that step, after printing "stopping":
a holder frozen at the worst moment, the test continues it with SIGCONT.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from pipeline import lease
from stages.core.sessions import LeaseLost, StopFlag, stop_on_sigterm

WORK_SECONDS = 120.0


def main(run_uri: str, mode: str, seconds: float, extra: list[str]) -> int:
    if mode == "sft":
        return sft_session(run_uri, seconds, int(extra[0]) if extra else None)
    if mode == "hold":
        with lease.held(run_uri, f"holder-flow-run-{seconds}", ttl=seconds):
            print("held", flush=True)
            time.sleep(600)
        return 0
    if mode == "work":
        return work(run_uri, seconds)
    try:
        taken = lease.acquire(run_uri, "contender-flow-run", wait_seconds=seconds, poll_seconds=0.2)
    except lease.LeaseHeld as e:
        print(e, file=sys.stderr)
        return 4
    previous = None if taken.took_over is None else taken.took_over.model_dump(mode="json")
    print(json.dumps(previous), flush=True)
    taken.release()
    return 0


def work(run_uri: str, ttl: float) -> int:
    flag = StopFlag()
    try:
        with (
            lease.held(run_uri, "worker", ttl=ttl, on_lost=flag.abort) as held,
            stop_on_sigterm(flag),
        ):
            print("held", flush=True)
            end = time.monotonic() + WORK_SECONDS
            while time.monotonic() < end:
                sum(i * i for i in range(10_000))  # compute that never reads the flag
            held.check()  # the fence before a commit
            print("committed", flush=True)
    except LeaseLost as e:
        print(e, file=sys.stderr)
        return 5
    return 0


SFT_STEPS, SFT_CHECKPOINT_EVERY = 20, 5


def sft_session(run_uri: str, ttl: float, stop_before_save: int | None) -> int:
    from stages import sft
    from stages.core.runner import RunContext
    from stages.data_prep import build as data_prep
    from tests.conftest import use_session_compile_cache
    from tests.integration._sft_child import child_recipe

    use_session_compile_cache()
    root, run = run_uri.rsplit("/", 1)
    recipe: Any = child_recipe(root, SFT_STEPS, SFT_CHECKPOINT_EVERY)
    if stop_before_save is not None:
        stop_myself_before_saving(stop_before_save)
    flag = StopFlag()
    try:
        with (
            lease.held(run_uri, f"sft-{os.getpid()}", ttl=ttl, on_lost=flag.abort) as held,
            stop_on_sigterm(flag),
        ):
            ctx = RunContext(root=root, run=run, stop=flag, fence=held.check)
            print("held", flush=True)
            dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
            out = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx)
            print(f"RECORD {out.record_uri}", flush=True)
    except LeaseLost as e:
        print(e, file=sys.stderr)
        return 5
    return 0


def stop_myself_before_saving(step: int) -> None:
    """SIGSTOP this process when the trainer is about to save `step` (its step's metrics are
    written just before the save in Tunix's loop)."""
    from tunix.sft import peft_trainer

    original = peft_trainer.PeftTrainer._write_train_metrics

    def write_then_stop(self: Any) -> None:
        original(self)
        if self.train_steps == step and self.checkpoint_manager.latest_step() != step:
            print("stopping", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    peft_trainer.PeftTrainer._write_train_metrics = write_then_stop  # type: ignore[method-assign]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]))
