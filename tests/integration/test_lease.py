"""One writer per run, with real processes: a second session waits then gives up naming the
holder; a holder killed with SIGKILL stops renewing, and its expired lease is taken over
(recorded in run.json by `far run`). On local storage and on the GCS API (fake-gcs-server),
whose generation preconditions make the create and the takeover atomic."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipeline import lease
from pipeline.manifest import read_manifest
from schemas.record import LeaseHolder
from stages.core import records, storage
from tests.conftest import REPO

HOLDER_TTL = 3.0  # seconds: renewed every second while the holder lives


def child(run_uri: str, mode: str, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration._lease_child", run_uri, mode, str(seconds)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextmanager
def holder(run_uri: str) -> Iterator[subprocess.Popen[str]]:
    proc = child(run_uri, "hold", HOLDER_TTL)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def current_holder(run_uri: str) -> LeaseHolder:
    return LeaseHolder.model_validate_json(storage.read_bytes(lease.lease_uri(run_uri)))


def contend_then_take_over(run_uri: str) -> None:
    with holder(run_uri) as proc:
        first = current_holder(run_uri)
        assert first.pid == proc.pid
        time.sleep(HOLDER_TTL + 1)  # past the first expiry: only the heartbeat keeps it
        assert current_holder(run_uri).expires_at > first.expires_at  # renewed
        contender = child(run_uri, "take", 1.0)
        _, err = contender.communicate(timeout=120)
        assert contender.returncode == 4
        assert f"pid {proc.pid}" in err and "holder-flow-run-3.0" in err
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert storage.exists(lease.lease_uri(run_uri))  # a killed holder cannot release it
    taker = child(run_uri, "take", 30.0)
    out, err = taker.communicate(timeout=120)
    assert taker.returncode == 0, err
    assert json.loads(out)["pid"] == proc.pid
    assert not storage.exists(lease.lease_uri(run_uri))  # released at the end


def test_second_process_waits_then_gives_up_and_kill_9_is_taken_over(tmp_path: Path) -> None:
    contend_then_take_over(str(tmp_path / "run"))


@pytest.mark.gcs
def test_lease_on_gcs(fake_gcs: str) -> None:
    contend_then_take_over(f"gs://{fake_gcs}/lease-test/run")


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_far_run_exits_4_naming_the_holder_then_records_a_takeover(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows import cli

    root = str(tmp_path)
    run_uri = storage.join(root, "smoke")
    # a short run (a budget too small to make progress is refused before the lease now)
    short = ["sft.max_steps=2", "grpo.max_steps=2"]
    command = ["run", str(REPO / "recipes/smoke.yaml"), "--root", root, *short]
    with holder(run_uri) as proc:
        assert cli.main([*command, "--lease-wait", "1"]) == cli.EXIT_LEASE_HELD
        assert f"pid {proc.pid}" in capsys.readouterr().err
        os.kill(proc.pid, signal.SIGKILL)
    time.sleep(HOLDER_TTL)
    # takes over, records it, then runs the short recipe to its end
    assert cli.main(command) == 0
    [invocation] = read_manifest(run_uri).invocations
    assert invocation.took_over is not None and invocation.took_over["pid"] == proc.pid
    assert not storage.exists(lease.lease_uri(run_uri))


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_far_run_that_loses_its_lease_stops_at_once_with_exit_5(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newcomer takes the lease over while `far run` works (as after the holder stalled past
    the lease's lifetime): the holder's next commit finds it lost and the run exits 5 having
    committed nothing, leaving the newcomer's lease in place."""
    from flows import cli
    from flows.commands import run as run_command

    root = str(tmp_path)
    run_uri = storage.join(root, "smoke")
    newcomer = threading.Thread(target=_take_over_when_held, args=(run_uri,), daemon=True)
    newcomer.start()
    assert cli.main(["run", str(REPO / "recipes/smoke.yaml"), "--root", root]) == 5
    assert "lost the run lease" in capsys.readouterr().err
    newcomer.join(timeout=5)
    assert list(Path(run_uri).glob("*/stage.json")) == []
    assert current_holder(run_uri).flow_run_id == "newcomer"
    assert (
        "far" in run_command.RUN_EPILOG
        and "5 this session lost the run's lease" in run_command.RUN_EPILOG
    )


def _take_over_when_held(run_uri: str) -> None:
    give_up = time.monotonic() + 120
    while time.monotonic() < give_up:
        current = storage.read_versioned(lease.lease_uri(run_uri))
        if current is not None:
            holder = LeaseHolder.model_validate_json(current[0])
            mine = holder.model_copy(update={"token": "newcomer", "flow_run_id": "newcomer"})
            if storage.replace_if_version(
                lease.lease_uri(run_uri), mine.model_dump_json().encode(), current[1]
            ):
                return
        time.sleep(0.01)


def test_a_killed_holder_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    run_uri = str(tmp_path / "run")
    proc = child(run_uri, "hold", 300.0)  # a lease that would last five minutes
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    taker = child(run_uri, "take", 0.0)  # no waiting at all
    out, err = taker.communicate(timeout=60)
    assert taker.returncode == 0, err
    assert json.loads(out)["pid"] == proc.pid
    assert f"pid {proc.pid} is gone from this host" in err


def test_a_holder_stopped_past_its_lease_stops_at_once_after_sigcont(tmp_path: Path) -> None:
    """A holder frozen by SIGSTOP past its lease's lifetime loses the lease to a newcomer; on
    SIGCONT its first (overdue) heartbeat finds the other holder and the session stops there
    with LeaseLost (exit 5), interrupting the compute it was in, instead of computing on until
    its next commit is fenced (the work below would take two minutes)."""
    run_uri = str(tmp_path / "run")
    proc = child(run_uri, "work", HOLDER_TTL)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(HOLDER_TTL + 1)  # frozen past the lease's expiry
        newcomer = lease.acquire(run_uri, "newcomer")
        assert newcomer.took_over is not None and newcomer.took_over.pid == proc.pid
        assert newcomer.took_over_reason == "expired"
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=30)  # its work alone would take 120 s
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 5, err
    assert "lost the run lease" in err and "committed" not in out
    assert current_holder(run_uri).token == newcomer.holder.token  # the loser left it alone
    newcomer.renew()
    newcomer.release()


def test_far_run_into_a_held_lease_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    """The real `far run` (a child process with its own temporary Prefect server) against a
    lease a second process holds: exit 4 and stderr is the one `far:` line naming the holder,
    with no Prefect traceback above it (hidden by the console filter of 5df2879)."""
    root = tmp_path / "runs"
    run_uri = storage.join(str(root), "smoke")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path),
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "JAX_PLATFORMS": "cpu",
    }
    recipe = str(REPO / "recipes" / "smoke.yaml")
    command = [sys.executable, "-m", "flows.cli", "run", recipe, "--root", str(root)]
    with holder(run_uri) as proc:
        done = subprocess.run(
            [*command, "--lease-wait", "1", "sft.max_steps=2", "grpo.max_steps=2"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert current_holder(run_uri).pid == proc.pid  # still the holder's
    assert done.returncode == 4, done.stderr
    lines = done.stderr.strip().splitlines()  # above it: the flow's INFO log lines only
    said = [line for line in lines if line.startswith("far: ")]
    assert said == lines[-1:] and f"pid {proc.pid}" in said[0], done.stderr
    for unwanted in ("Traceback", "ERROR", "LeaseHeld"):
        assert unwanted not in done.stderr + done.stdout, done.stderr


def tree_digest(directory: Path) -> dict[str, str]:
    """Every file under `directory` by its path and sha256: what "writes nothing" compares."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def sft_child(run_uri: str, ttl: float, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration._lease_child", run_uri, "sft", str(ttl), *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("stop_before_save", [10, 20], ids=["mid-training", "final-save"])
def test_a_holder_stopped_before_a_save_writes_nothing_into_the_stage_its_successor_committed(
    tmp_path: Path, stop_before_save: int
) -> None:
    """Real processes, real signals, a short lease: holder A runs SFT and is frozen (SIGSTOP)
    just before the trainer saves a step; past its lease's lifetime holder B takes the run
    over, finishes SFT from A's last checkpoint and commits it. A is continued (SIGCONT) at
    the save: every checkpoint write is fenced by the lease, so A stops with exit 5 and the
    committed stage directory is byte for byte what B committed, and still matches its
    sealed record."""
    run_uri = str(tmp_path / "child")
    stale = sft_child(run_uri, HOLDER_TTL, str(stop_before_save))
    try:
        wait_until_stopped(stale)
        time.sleep(HOLDER_TTL + 1)  # frozen past its lease's lifetime
        successor = sft_child(run_uri, 60.0)
        out, err = successor.communicate(timeout=600)
        assert successor.returncode == 0, err
        assert "took over the run lease" in err and "expired" in err
        [record_line] = [line for line in out.splitlines() if line.startswith("RECORD ")]
        stage = Path(record_line.split(" ", 1)[1]).parent
        committed = tree_digest(stage)
        os.kill(stale.pid, signal.SIGCONT)
        _, stale_err = stale.communicate(timeout=120)
    finally:
        if stale.poll() is None:
            stale.kill()
        stale.wait(timeout=30)
    assert stale.returncode == 5, stale_err
    assert "lost the run lease" in stale_err, stale_err
    assert tree_digest(stage) == committed  # not one file written, changed or deleted
    for record_uri in sorted(str(p) for p in Path(run_uri).glob("*/stage.json")):
        record = records.read_record(record_uri)  # the audit's checks of a stage: seal, files
        assert record is not None
        records.verify_before_reuse(record_uri, record)


def wait_until_stopped(proc: subprocess.Popen[str]) -> None:
    """Block until `proc` says it stops itself, then until the kernel shows it stopped."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "stopping":
            break
    else:
        raise AssertionError(f"the holder ended without stopping: {proc.wait()} {proc.stderr}")
    give_up = time.monotonic() + 30
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < give_up, "the holder never stopped"
        time.sleep(0.05)
