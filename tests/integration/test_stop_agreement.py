"""Processes of one multi-host program stop training at the same step: a stop request that
reaches one process only (a SIGTERM to one host) stops all of them (jax.distributed on CPU)."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.conftest import REPO


def test_a_stop_seen_by_one_process_stops_both_at_the_same_batch() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.integration._stop_agreement_child", str(port), str(i)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (0, 1)
    ]
    counts = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        counts.append(int(out.strip().splitlines()[-1]))
    assert counts == [2, 2]  # process 0 never saw the stop itself
