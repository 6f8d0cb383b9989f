"""The run lease in one process (two processes, kill -9 and gs:// are in integration)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pipeline import lease
from schemas.record import LeaseHolder
from stages.core import storage
from stages.core.sessions import LeaseLost, StepClock, StopFlag, guarded


@pytest.fixture(params=["local", "memory"])
def run_uri(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "run")
    return f"memory://far-lease-{uuid.uuid4().hex[:8]}/run"


def test_held_is_released_at_the_end_even_on_error(run_uri: str) -> None:
    with pytest.raises(RuntimeError, match="boom"), lease.held(run_uri, "flow-1"):
        holder = LeaseHolder.model_validate_json(storage.read_bytes(lease.lease_uri(run_uri)))
        assert holder.flow_run_id == "flow-1"
        raise RuntimeError("boom")
    assert not storage.exists(lease.lease_uri(run_uri))


def test_a_live_lease_is_refused_naming_its_holder(run_uri: str) -> None:
    first = lease.acquire(run_uri, "flow-1")
    with pytest.raises(lease.LeaseHeld, match=r"pid \d+ \(flow run flow-1\)"):
        lease.acquire(run_uri, "flow-2", wait_seconds=0.3, poll_seconds=0.1)
    first.release()
    lease.acquire(run_uri, "flow-2").release()


def test_an_expired_lease_is_taken_over_and_its_old_holder_cannot_renew(run_uri: str) -> None:
    old = lease.acquire(run_uri, "flow-1", ttl=60)
    expired = old.holder.model_copy(update={"expires_at": datetime.now(UTC) - timedelta(1)})
    assert storage.replace_if_version(old.uri, expired.model_dump_json().encode(), old.version)
    new = lease.acquire(run_uri, "flow-2")
    assert new.took_over is not None and new.took_over.token == old.holder.token
    with pytest.raises(RuntimeError, match="another session took it over"):
        old.renew()
    new.renew()
    new.release()


def take_over(old: lease.Lease, run_uri: str) -> lease.Lease:
    """What a newcomer does once `old` stopped renewing past its lifetime."""
    expired = old.holder.model_copy(update={"expires_at": datetime.now(UTC) - timedelta(1)})
    current = storage.read_versioned(old.uri)
    assert current is not None
    assert storage.replace_if_version(old.uri, expired.model_dump_json().encode(), current[1])
    return lease.acquire(run_uri, "newcomer")


def test_a_session_that_lost_its_lease_commits_nothing(run_uri: str) -> None:
    from stages.core import ledger
    from stages.core.records import RECORD_NAME
    from stages.core.runner import RunContext, StageIdentity, run_stage

    old = lease.acquire(run_uri, "stalled", ttl=60)
    root, run = run_uri.rsplit("/", 1)
    ctx = RunContext(root=root, run=run, fence=old.check)
    written: list[str] = []

    def work(directory: str) -> tuple[Any, dict[str, float], dict[str, list[float]]]:
        take_over(old, run_uri)  # the holder stalled (SIGSTOP) while a newcomer took over
        written.append(directory)
        return None, {}, {}

    with pytest.raises(LeaseLost, match="another session took it over"):
        run_stage(ctx, StageIdentity("sft", 1, {}, {}), work)
    [directory] = written
    assert not storage.exists(storage.join(directory, RECORD_NAME))
    assert storage.list_files(storage.join(directory, "sessions")) == {}  # no note either
    assert ledger.read(ctx.run_uri) == []
    assert LeaseHolder.model_validate_json(storage.read_bytes(old.uri)).flow_run_id == "newcomer"


def test_the_heartbeat_aborts_training_once_the_lease_is_taken_over(run_uri: str) -> None:
    flag = StopFlag()
    with lease.held(run_uri, "stalled", ttl=0.6, on_lost=flag.abort) as held:
        take_over(held, run_uri)
        deadline = time.monotonic() + 10
        while flag.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert isinstance(flag.error, LeaseLost)
        batches = guarded(iter(range(5)), None, flag, 0.0, StepClock())
        with pytest.raises(LeaseLost):  # raised, not a clean stop: no final checkpoint save
            next(batches)
    # the loser does not release (or touch) the newcomer's lease
    assert LeaseHolder.model_validate_json(storage.read_bytes(held.uri)).flow_run_id == "newcomer"


def test_a_holder_whose_pid_is_gone_from_this_host_is_taken_over_at_once(run_uri: str) -> None:
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # exited and reaped: its pid names no process now
    first = lease.acquire(run_uri, "killed", ttl=300)
    dead = first.holder.model_copy(update={"pid": gone.pid})
    assert storage.replace_if_version(first.uri, dead.model_dump_json().encode(), first.version)
    taken = lease.acquire(run_uri, "next")  # no wait: the lease has 300 s left
    assert taken.took_over is not None and taken.took_over.pid == gone.pid
    assert taken.took_over_reason == f"pid {gone.pid} is gone from this host"
    # a live pid (this process) keeps it; so does a lease from before namespaces were recorded
    with pytest.raises(lease.LeaseHeld):
        lease.acquire(run_uri, "third")
    older = dead.model_copy(update={"pid_namespace": None, "token": "older"})
    assert storage.replace_if_version(taken.uri, older.model_dump_json().encode(), taken.version)
    with pytest.raises(lease.LeaseHeld):
        lease.acquire(run_uri, "third")


def test_the_write_fence_refuses_a_stage_another_session_committed(tmp_path: Any) -> None:
    """run_stage's fence before each checkpoint write: a lease check, then no record there."""
    from stages.core import runner, sessions

    checks: list[int] = []
    ctx = runner.RunContext(root=str(tmp_path), run="r", fence=lambda: checks.append(1))
    record_uri = storage.join(str(tmp_path), "r", "sft-0123456789ab", "stage.json")
    with sessions.fencing(lambda: runner._fence_stage(ctx, record_uri)):
        sessions.check_writes()
        assert checks == [1]
        sessions.check_writes(within=60.0)  # frequent writes: a check that just passed suffices
        assert checks == [1]
        storage.write_json(record_uri, {"committed": "by another session"})
        with pytest.raises(LeaseLost, match="committed by another session"):
            sessions.check_writes()
    sessions.check_writes()  # outside a stage's work: nothing to check
    assert checks == [1, 1]


def test_a_stage_that_loses_its_lease_writes_no_more_files_into_its_directory(
    tmp_path: Any,
) -> None:
    """Every write a stage makes through storage (an evaluation's report, a dataset's shard)
    asks the fence first: once another session committed the stage, the stale session's next
    write raises and the committed directory keeps what its successor wrote."""
    from stages.core import runner, sessions

    lost = {"now": False}

    def fence() -> None:
        if lost["now"]:
            raise LeaseLost("the run lease was taken over (test)")

    ctx = runner.RunContext(root=str(tmp_path), run="r", fence=fence)

    def work(directory: str) -> tuple[None, dict[str, float], dict[str, list[float]]]:
        storage.write_json(storage.join(directory, "report.json"), {"by": "this session"})
        storage.write_json(storage.join(str(tmp_path), "r", "elsewhere.json"), {})  # not fenced
        lost["now"] = True
        time.sleep(1.1)  # past the once-a-second check: a stopped process checks again
        storage.write_json(storage.join(directory, "late.json"), {"by": "a stale session"})
        raise AssertionError("the late write was not refused")

    with pytest.raises(LeaseLost, match="taken over"):
        runner.run_stage(ctx, runner.StageIdentity("evaluate", 1, {}, {}), work)
    [stage] = [p for p in (tmp_path / "r").iterdir() if p.name.startswith("evaluate-")]
    assert (stage / "report.json").exists() and not (stage / "late.json").exists()
    assert (tmp_path / "r" / "elsewhere.json").exists()
    sessions.check_writes()  # the guard is gone with the stage: nothing to check
    storage.write_json(storage.join(str(stage), "after.json"), {})
