"""A default `far run` prints FAR's own lines only: none of the warnings below, each
shown harmless here with real processes (a real temporary Prefect server, a real flow on it).

- Python's / JAX's `os.fork()` deadlock warning: far's temporary server was started with a
  preexec_fn, so the forked child ran the parent's at-fork hooks (Python code, in a
  multithreaded process). Now no Python runs between fork and exec (no at-fork hook fires in
  a child), and the server still dies with a SIGKILLed parent (PR_SET_PDEATHSIG, now set by a
  fresh interpreter that execs the server).
- "View at http://...": the temporary server serves no UI, so no link is printed.
- Prefect's "attempted to send logs to the API without a flow run id" UserWarning, for a log
  line from a library's own thread: the line still reaches the console.
- Tunix's "Skipping non-TPU device: cpu. You might be missing jax[tpu]": it only skips a TPU
  memory report (tests/unit/test_quiet_console.py), and other absl warnings still show.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO

NOISE = ("os.fork()", "Warning", "View at", "jax[tpu]", "without a flow run id")


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_temporary_server_and_a_flow_print_no_warning(tmp_path: Path) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PREFECT_HOME": str(tmp_path / "prefect")}
    for key in ("PREFECT_API_URL", "PREFECT_UI_URL", "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW"):
        env.pop(key, None)
    marker, err = tmp_path / "python-ran-in-a-forked-child", tmp_path / "stderr"
    with err.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.integration._quiet_console_child", str(marker)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            lines = []
            for line in child.stdout:  # type: ignore[union-attr]
                lines.append(line)
                if line.startswith("flow done"):
                    break
            assert lines and lines[-1].startswith("flow done"), (lines, err.read_text())
            server = int(next(x for x in lines if x.startswith("server ")).split()[1])
            assert alive(server)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
    deadline = time.monotonic() + 30
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(server), "the temporary server outlived a SIGKILLed parent"
    assert not marker.exists(), "Python code ran in a forked child before exec"
    console = err.read_text()
    assert "Beginning flow run" in console  # Prefect's own lines still reach the console
    assert "progress: from a library thread" in console
    assert "an absl warning a user can act on" in console
    assert not [noise for noise in NOISE if noise in console], console
