"""Ctrl-C at a terminal and a killed `far`, with real processes: the first Ctrl-C (SIGINT to
the whole foreground process group, as a terminal sends it) saves and stops like SIGTERM (exit
3, how to continue); a second aborts with 130; far's temporary Prefect server is in its own
session (the Ctrl-C does not reach it) and dies with `far`, even when `far` is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from pipeline import manifest
from tests.conftest import BIN, REPO, smoke_data

pytestmark = pytest.mark.slow
FAR = str(BIN / "far")


def far_job(*args: str, home: Path) -> subprocess.Popen[str]:
    """`far` as a terminal starts a job: its own process group, no Prefect API configured."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    return subprocess.Popen(
        [FAR, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def long_sft_recipe(tmp_path: Path, max_steps: int = 200) -> Path:
    data = smoke_data()
    data["sft"].update(max_steps=max_steps, checkpoint_every_steps=10)
    data["grpo"].update(max_steps=2, checkpoint_every_steps=1)
    data["eval"]["models"] = ["sft"]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data))
    return recipe


def wait_for(condition: object, proc: subprocess.Popen[str], seconds: float = 400) -> None:
    deadline = time.time() + seconds
    while not condition():  # type: ignore[operator]
        assert proc.poll() is None, proc.stdout.read()  # type: ignore[union-attr]
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def server_children(pid: int) -> list[int]:
    """Processes whose parent is `pid` and that run a Prefect server (far's, or Prefect's own
    ephemeral one)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        servers = (b"prefect server start", b"prefect.server.api.server:create_app")
        if ppid == pid and any(server in cmdline for server in servers):
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_first_ctrl_c_saves_and_stops_a_second_aborts(tmp_path: Path) -> None:
    recipe, root, home = long_sft_recipe(tmp_path), tmp_path / "runs", tmp_path / "prefect"
    run = far_job("run", str(recipe), "--root", str(root), home=home)
    wait_for(lambda: list(root.glob("smoke/sft-*/checkpoints/10")), run)
    [server] = server_children(run.pid)
    os.killpg(run.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    sent = time.monotonic()
    output = run.communicate(timeout=300)[0]
    print(f"first Ctrl-C to exit: {time.monotonic() - sent:.1f} s")
    assert run.returncode == 3, output[-3000:]
    assert "received signal SIGINT" in output and "Run the same command again" in output
    assert "Prefect API became unreachable" not in output
    assert not alive(server)  # stopped with far, after serving the whole run
    sft = next(s for s in manifest.run_status(str(root / "smoke")) if s.stage == "sft")
    assert sft.state == "partial" and sft.step is not None and sft.step >= 10

    again = far_job("run", str(recipe), "--root", str(root), home=home)
    first_step = sft.step

    def trained_further() -> bool:
        steps = [p.name for p in root.glob("smoke/sft-*/checkpoints/*")]
        return any(name.isdigit() and int(name) > first_step for name in steps)

    wait_for(trained_further, again)
    os.killpg(again.pid, signal.SIGINT)
    # the second Ctrl-C must reach far while it is still finishing its step and saving: send
    # it as soon as far has said it is saving (a fixed sleep raced a step of 0.4 s plus a
    # 0.1 s save with a warm compile cache, and two signals sent while a compiled step runs
    # reach Python's handler as one)
    seen = []
    for line in again.stdout:  # type: ignore[union-attr]
        seen.append(line)
        if "saving and stopping" in line:
            os.killpg(again.pid, signal.SIGINT)
            break
    output = "".join(seen) + again.communicate(timeout=300)[0]
    assert again.returncode == 130, output[-3000:]
    assert "aborted by Ctrl-C" in output


def test_the_temporary_server_dies_with_a_killed_far(tmp_path: Path) -> None:
    recipe, root, home = long_sft_recipe(tmp_path), tmp_path / "runs", tmp_path / "prefect"
    run = far_job("run", str(recipe), "--root", str(root), home=home)
    wait_for(lambda: server_children(run.pid) and (root / "smoke" / "lease.json").exists(), run)
    [server] = server_children(run.pid)
    os.kill(run.pid, signal.SIGKILL)
    run.communicate(timeout=60)
    deadline = time.time() + 30
    while alive(server) and time.time() < deadline:
        time.sleep(0.2)
    assert not alive(server)
