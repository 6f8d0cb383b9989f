"""The test session configures Prefect's logging before anything imports JAX.

Prefect's first import configures logging (logging.config.dictConfig), which closes every
handler already installed; absl's handler (installed when JAX is imported) then closes its
stream unless that stream is the current sys.stderr. Under pytest, that stream was the
capture file of the test that first imported JAX, and closing it failed a later test and
every one after it on the worker ("I/O operation on closed file"). Checked in a child
process, as a worker starts: tests/conftest.py's session start, then absl under one stderr,
then Prefect under another."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

SCRIPT = """
import io, sys
first = io.StringIO()
sys.stderr = first
{setup}
import absl.logging  # its handler keeps the sys.stderr of this moment
sys.stderr = io.StringIO()
import prefect.main  # configures logging once per process
print(first.closed)
"""


def _first_stderr_closed(setup: str) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(setup=setup)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1] == "True"


def test_the_test_setup_keeps_prefect_from_closing_an_earlier_stderr() -> None:
    setup = "import tests.conftest; tests.conftest.pytest_sessionstart(None)"
    assert not _first_stderr_closed(setup)
    # the defect it answers, without the setup
    assert _first_stderr_closed("import tests.conftest")
