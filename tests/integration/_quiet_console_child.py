"""far's console set-up, JAX initialised, then far's temporary Prefect server and one flow on
it: what a default `far run` does before its stages, without training anything.

usage: python -m tests.integration._quiet_console_child MARKER

The flow logs from a thread without a flow run context (as Tunix's GRPO learner reports
progress) and emits Tunix's CPU memory-report warning. An at-fork hook writes MARKER if any
Python code runs in a forked child. Prints "server PID" then "flow done", then sleeps until
killed (the test kills it with SIGKILL and watches the server die with it).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

from flows import prefect_server
from flows.commands import console


def main(marker: str) -> None:
    console.configure_logging(verbose=False)
    console.configure_prefect(os.environ)  # type: ignore[arg-type]
    import jax

    jax.devices()  # JAX's backend is up: its at-fork hook (a RuntimeWarning) is registered
    os.register_at_fork(after_in_child=lambda: Path(marker).touch())
    server = prefect_server.ensure_api(os.environ, 120)
    assert server is not None, "a Prefect API was configured: the test must clear it"
    print(f"server {server.process.pid}", flush=True)
    from prefect import flow

    def library_thread() -> None:
        logging.getLogger("stages.core.progress").info("progress: from a library thread")

    @flow
    def quiet() -> None:
        thread = threading.Thread(target=library_thread)
        thread.start()
        thread.join()
        logging.getLogger("absl").warning(
            "Skipping non-TPU device: %s. You might be missing jax[tpu] dependency.", "cpu"
        )
        logging.getLogger("absl").warning("an absl warning a user can act on")

    quiet()
    print("flow done", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1])
