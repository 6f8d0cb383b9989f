"""The temporary Prefect server of a `far` process that has no Prefect API configured.

Prefect's own ephemeral mode starts its server as a plain child process: it shares the
terminal's process group, so the first Ctrl-C killed it under a running flow ("the Prefect API
became unreachable"), and it outlived a `far` killed with SIGKILL. `far` starts it instead, with
Prefect's public `prefect server start` (no UI), in its own session (a Ctrl-C at the terminal
reaches `far` only) and, on Linux, with PR_SET_PDEATHSIG so the kernel stops it when `far`
dies however it dies. It serves the whole process (like Prefect's own), stopped at exit.

The child runs no Python between fork and exec: a `preexec_fn` (how the prctl was made) makes
subprocess run the parent's at-fork hooks, and JAX's warns of a deadlock on every run. The
prctl is made instead by a fresh interpreter (LAUNCHER) that then execs the server. With no
UI served, Prefect's "View at http://..." link would point at nothing: PREFECT_UI_URL is
emptied for this process, which drops it.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from stages.core.errors import InputError

# A new interpreter's first act: PR_SET_PDEATHSIG (prctl(2) option 1) so the kernel sends
# SIGTERM when `far` (argv[1]) dies; exit if it already did; then exec the server (argv[2:]).
LAUNCHER = """\
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(sys.argv[1]):
        os._exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""
TIMEOUT_TEXT = "Timed out while attempting to connect to ephemeral Prefect API server"


@dataclass
class TemporaryServer:
    process: subprocess.Popen[bytes]
    api_url: str
    log: IO[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def ensure_api(environ: MutableMapping[str, str], startup_seconds: float) -> TemporaryServer | None:
    """Start a temporary server unless a Prefect API is configured (environment, profile or
    a test harness's settings); point this process's Prefect at it. None when one was set."""
    from prefect.context import refresh_global_settings_context
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url:
        return None
    check_home(Path(settings.home))
    server = start(startup_seconds)
    environ["PREFECT_API_URL"] = server.api_url
    environ["PREFECT_UI_URL"] = ""  # no UI is served: no "View at" link
    refresh_global_settings_context()  # Prefect reads the environment again (public API)
    atexit.register(server.stop)
    return server


class PrefectHomeUnusable(InputError):
    """PREFECT_HOME cannot be created or is not a directory: the server would not start."""


def check_home(home: Path) -> None:
    """Before the server starts: Prefect creates its home without parents, and a server that
    cannot would only time out (was: reported as a start timeout)."""
    if home.is_dir():
        return
    if home.exists():
        raise PrefectHomeUnusable(
            f"PREFECT_HOME {home} is not a directory; expected a directory (set PREFECT_HOME "
            f"to one, or remove the file)"
        )
    if not home.parent.is_dir():
        raise PrefectHomeUnusable(
            f"PREFECT_HOME {home}: its parent {home.parent} does not exist, so Prefect cannot "
            f"create it; create it (mkdir -p {home}) or set PREFECT_HOME to a directory that "
            f"exists"
        )


def start(startup_seconds: float) -> TemporaryServer:
    """`prefect server start` on a free loopback port, healthy, or RuntimeError(TIMEOUT_TEXT)."""
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    log = tempfile.TemporaryFile(prefix="far-prefect-server-")  # noqa: SIM115  # closed by stop()
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1"]
    launch = [sys.executable, "-c", LAUNCHER, str(os.getpid())]
    process = subprocess.Popen(  # no preexec_fn: no Python runs in the forked child
        [*launch, *command, "--port", str(port), "--no-ui", "--log-level", "ERROR"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a Ctrl-C at the terminal reaches far, not the server
    )
    server = TemporaryServer(process, api_url, log)
    give_up = time.monotonic() + startup_seconds
    while not _healthy(api_url):
        if process.poll() is not None or time.monotonic() > give_up:
            server.stop()
            raise RuntimeError(f"{TIMEOUT_TEXT} (far's temporary server, {_tail(log)})")
        time.sleep(0.2)
    return server


def _healthy(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(log: IO[bytes]) -> str:
    try:
        log.seek(0)
        text = log.read().decode(errors="replace").strip()
    except (OSError, ValueError):
        return "no output"
    return text[-500:] or "no output"
