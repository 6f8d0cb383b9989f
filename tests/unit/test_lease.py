"""The run lease in one process (two processes, kill -9 and gs:// are in integration)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from pipeline import lease
from schemas.record import LeaseHolder
from stages.core import storage


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
