"""A hub endpoint that accepts connections and never answers stops `far validate` within the
hub timeout (connect and read, 10 s each) with one line naming the endpoint, instead of
minutes of silence. A real socket on loopback (tests/silent_server.py) as HF_ENDPOINT, the
real huggingface_hub client, the real `far` executable."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from stages.modeling.weight_sources import HUB_TIMEOUT_SECONDS
from tests.conftest import REPO, smoke_data
from tests.silent_server import silent_server

FAR = str(Path(sys.executable).with_name("far"))


def hub_recipe(tmp_path: Path) -> Path:
    data = smoke_data()
    data["storage_root"] = str(tmp_path / "runs")
    data["model"] = {
        "family": "gemma3",
        "source": "hub",
        "uri": "google/gemma-3-270m",
        "preset": "gemma3_270m",
        "tokenizer": "sentencepiece",
    }
    path = tmp_path / "hub.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_silent_hub_endpoint_is_one_line_within_the_timeout(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    env.pop("HF_HUB_OFFLINE", None)
    with silent_server() as port:
        endpoint = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        done = subprocess.run(
            [FAR, "validate", str(hub_recipe(tmp_path)), "--cache-dir", str(tmp_path / "c")],
            env={**env, "HF_ENDPOINT": endpoint},
            capture_output=True,
            text=True,
            timeout=HUB_TIMEOUT_SECONDS + 50,  # the old client waited minutes
        )
        took = time.monotonic() - started
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.startswith("far: ")]
    assert (
        f"the hub endpoint {endpoint} did not connect or answer within 10 s (ReadTimeout)" in line
    )
    assert "cannot download 'google/gemma-3-270m'" in line
    assert took < HUB_TIMEOUT_SECONDS + 40
