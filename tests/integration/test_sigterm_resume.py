"""SIGTERM (a TPU VM's preemption notice) to a real `far run`: it saves, stops cleanly with exit 3
and the continue hint; `far status` shows the partial stage; `far resume` finishes the run.

The signalled `far run` paces its SFT (tests/integration/_paced_far_child.py: flows.cli.main
with a sleep before every SFT batch), so the SIGTERM sent once step 10 is saved lands well
before the last of SFT_STEPS with little compute; `far resume` is the plain `far`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import manifest
from tests.conftest import BIN, REPO
from tests.integration.test_ctrl_c import long_sft_recipe

pytestmark = pytest.mark.slow
FAR = str(BIN / "far")
SFT_STEPS, PACE_S = 60, 0.3  # 50 steps after the checkpoint at 10: 15 s of sleep at least


def far(*args: str, home: Path, pace_s: float | None = None) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)  # ephemeral Prefect, as on a fresh machine
    paced = [sys.executable, "-m", "tests.integration._paced_far_child", str(pace_s)]
    command = [*(paced if pace_s else [FAR]), *args]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_sigterm_saves_and_stops_then_far_resume_finishes(tmp_path: Path) -> None:
    recipe = long_sft_recipe(tmp_path, SFT_STEPS)
    root, home = tmp_path / "runs", tmp_path / "prefect"
    run = far("run", str(recipe), "--root", str(root), home=home, pace_s=PACE_S)
    deadline = time.time() + 400
    while not list(root.glob("smoke/sft-*/checkpoints/10")):
        assert run.poll() is None, run.stdout.read()  # type: ignore[union-attr]
        assert time.time() < deadline, "SFT saved no checkpoint"
        time.sleep(0.2)
    run.send_signal(signal.SIGTERM)
    output = run.communicate(timeout=300)[0]
    assert run.returncode == 3, output[-3000:]
    assert "INCOMPLETE" in output and "received signal SIGTERM" in output
    assert "Run the same command again to continue" in output
    run_uri = str(root / "smoke")
    sft_state = next(s for s in manifest.run_status(run_uri) if s.stage == "sft")
    assert sft_state.state == "partial" and sft_state.sessions == 1
    # saved where it stopped
    assert sft_state.step is not None and 10 <= sft_state.step < SFT_STEPS
    status = subprocess.run([FAR, "status", run_uri], capture_output=True, text=True, check=True)
    assert f"step {sft_state.step}/{SFT_STEPS}" in status.stdout
    resume = far("resume", run_uri, home=home)
    output = resume.communicate(timeout=900)[0]
    assert resume.returncode == 0, output[-3000:]
    # off a terminal the resumed SFT logs its progress counting the resumed offset once
    shown = [(int(a), int(b)) for a, b in re.findall(r"progress: sft (\d+)/(\d+)", output)]
    assert shown and all(step <= total for step, total in shown), shown
    assert shown[-1] == (SFT_STEPS, SFT_STEPS)
    assert "data_prep  skipped (already complete)" in output
    records = list(root.glob("smoke/sft-*/stage.json"))
    assert len(records) == 1
    done = next(s for s in manifest.run_status(run_uri) if s.stage == "sft")
    assert done.state == "complete" and done.sessions == 2  # the stopped one and the last one
