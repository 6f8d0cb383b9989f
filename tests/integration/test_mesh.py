"""SFT on a real 2-D mesh: 4 CPU devices forced by XLA_FLAGS, fsdp=2 x tp=2 (in a subprocess,
since the device count is fixed when JAX starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_sft_on_fsdp2_tp2_mesh(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(REPO),
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration._mesh_child", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("REPORT "))
    report = json.loads(line.removeprefix("REPORT "))
    assert report["devices"] == 4 and report["mesh"] == {"fsdp": 2, "tp": 2}
    assert report["q_devices"] == 4  # the attention weights span the whole mesh
    assert "tp" in report["q_spec"] and "fsdp" in report["q_spec"]
    assert "fsdp" in report["ffw_spec"] and "tp" in report["ffw_spec"]
