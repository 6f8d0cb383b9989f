"""Tunix's own trainer bar stays off where FAR draws the stage's bar (one bar per stage):
PeftTrainer draws one on a terminal whose ETA counts the compiling first step, and beside
FAR's it was a second bar. A real child process on a real pseudo-terminal, with a size."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios

import pytest

from tests.conftest import REPO


def on_a_terminal(*argv: str) -> str:
    """What `python argv` writes to a 120-column pseudo-terminal (stdout and stderr)."""
    reader, program = os.openpty()
    fcntl.ioctl(program, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    child = subprocess.Popen(
        [sys.executable, *argv], stdout=program, stderr=program, env=env, cwd=REPO
    )
    os.close(program)
    chunks = []
    while True:
        ready, _, _ = select.select([reader], [], [], 300)
        if not ready:
            child.kill()
            pytest.fail("the child wrote nothing for 300 s")
        try:
            chunk = os.read(reader, 65536)
        except OSError:  # EIO: the child exited and everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(reader)
    assert child.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")[-2000:]
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("mode", ["show", "hide"])
def test_tunix_draws_its_bar_on_a_terminal_unless_hidden(mode: str) -> None:
    written = on_a_terminal(str(REPO / "tests" / "integration" / "_tunix_bar_child.py"), mode)
    assert "trained 3 steps" in written
    assert ("TUNIXBAR" in written) == (mode == "show"), written[-2000:]
