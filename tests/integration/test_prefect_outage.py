"""The Prefect server going away mid-run: training goes on and the records land on storage.

A real `prefect server start` process is killed (SIGKILL) while `far run` is in its SFT stage.
Prefect 3 reports task states as events, so the remaining stages still run; the UI artifacts
and the flow's final state cannot be reported, and `far run` says so and reads the outcome
from storage instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from flows import cli
from tests.conftest import BIN, REPO, prefect_env, prefect_server_process, smoke_data

pytestmark = pytest.mark.slow


def test_server_killed_during_sft_the_run_still_completes_on_storage(tmp_path: Path) -> None:
    data = smoke_data()
    data["sft"].update(max_steps=40, checkpoint_every_steps=20)
    data["grpo"].update(max_steps=2, checkpoint_every_steps=1)
    data["eval"]["models"] = ["sft", "grpo"]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data))
    root = tmp_path / "runs"
    with prefect_server_process(tmp_path) as (api_url, server):
        env = prefect_env(tmp_path / "client", api_url)
        env["PREFECT_CLIENT_MAX_RETRIES"] = "1"  # fail fast once the API is gone
        run = subprocess.Popen(
            [str(BIN / "far"), "run", str(recipe), "--root", str(root)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_for(lambda: list(root.glob("smoke/sft-*/identity.json")), run, "SFT to start")
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
        output = run.communicate(timeout=900)[0]
    assert run.returncode == 0, output[-4000:]
    assert "the Prefect API became unreachable" in output
    for stage in ("data_prep", "sft", "grpo", "evaluate"):
        assert len(list(root.glob(f"smoke/{stage}-*/stage.json"))) == 1, stage
    assert cli.main(["audit", str(root / "smoke")]) == 0


def wait_for(found: object, proc: subprocess.Popen[str], what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not found():  # type: ignore[operator]
        if proc.poll() is not None:
            raise AssertionError(f"far run ended before {what}: {proc.stdout.read()}")  # type: ignore[union-attr]
        if time.time() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.2)
