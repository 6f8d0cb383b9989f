"""One of two jax.distributed CPU processes feeding `guarded` batches; process 1 alone gets a
stop request after 2 batches. Prints how many batches this process handed out.

usage: python -m tests.integration._stop_agreement_child PORT PROCESS_ID
"""

from __future__ import annotations

import sys

import jax

from stages.core.sessions import StepClock, StopFlag, guarded


class StopAfter(StopFlag):
    def __init__(self, after: int) -> None:
        super().__init__()
        self.after, self.checks = after, 0

    def is_set(self) -> bool:
        self.checks += 1
        if self.checks > self.after:
            self.request("SIGTERM (process 1 only)")
        return super().is_set()


def main(port: int, process_id: int) -> int:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
    flag = StopAfter(2) if process_id == 1 else StopFlag()
    handed_out = sum(1 for _ in guarded(iter(range(10)), None, flag, 0.0, StepClock()))
    print(handed_out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
