"""Hold or contend for a run's lease in its own process (tests kill the holder with SIGKILL).

usage: python -m tests.integration._lease_child RUN_URI hold TTL_SECONDS
       python -m tests.integration._lease_child RUN_URI take WAIT_SECONDS

hold: takes the lease (heartbeat every TTL/3), prints "held" and sleeps until killed.
take: takes the lease waiting up to WAIT_SECONDS, prints the holder it took over from (JSON,
or null) and releases it; exits 4 with the LeaseHeld message if a live holder kept it.
"""

from __future__ import annotations

import json
import sys
import time

from pipeline import lease


def main(run_uri: str, mode: str, seconds: float) -> int:
    if mode == "hold":
        with lease.held(run_uri, f"holder-flow-run-{seconds}", ttl=seconds):
            print("held", flush=True)
            time.sleep(600)
        return 0
    try:
        taken = lease.acquire(run_uri, "contender-flow-run", wait_seconds=seconds, poll_seconds=0.2)
    except lease.LeaseHeld as e:
        print(e, file=sys.stderr)
        return 4
    previous = None if taken.took_over is None else taken.took_over.model_dump(mode="json")
    print(json.dumps(previous), flush=True)
    taken.release()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
