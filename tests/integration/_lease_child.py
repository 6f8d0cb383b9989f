"""Hold or contend for a run's lease in its own process (tests kill the holder with SIGKILL).

usage: python -m tests.integration._lease_child RUN_URI hold TTL_SECONDS
       python -m tests.integration._lease_child RUN_URI take WAIT_SECONDS
       python -m tests.integration._lease_child RUN_URI work TTL_SECONDS

hold: takes the lease (heartbeat every TTL/3), prints "held" and sleeps until killed.
take: takes the lease waiting up to WAIT_SECONDS, prints the holder it took over from (JSON,
or null) and releases it; exits 4 with the LeaseHeld message if a live holder kept it.
work: holds the lease as `far run` does (flows/far_flow.py: the heartbeat aborts the session's
StopFlag, SIGTERM stops it), prints "held", then computes for WORK_SECONDS in the main thread
without looking at the flag (as a step, a generation or grading does), then commits behind the
lease's fence and prints "committed"; exits 5 with the LeaseLost message once it lost the lease.
"""

from __future__ import annotations

import json
import sys
import time

from pipeline import lease
from stages.core.sessions import LeaseLost, StopFlag, stop_on_sigterm

WORK_SECONDS = 120.0


def main(run_uri: str, mode: str, seconds: float) -> int:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
