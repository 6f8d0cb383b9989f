"""One writer per run: {root}/{run}/lease.json, held by the session that works on the run.

Two sessions on one run (two deployments on one recipe, a `far run` beside a scheduled run)
would write the same checkpoints, records and run.json. The lease is created atomically
(storage.create_exclusive: O_EXCL-style locally, ifGenerationMatch=0 on gs://), names its
holder (host, pid, flow run) and an expiry, and is renewed by a heartbeat thread while the
session works, then released. A second session waits up to its wait time, then gives up with
LeaseHeld (the CLI's EXIT_LEASE_HELD). A lease past its expiry belongs to a holder that died
(kill -9, a lost VM): it is taken over by a conditional replace, and the takeover is returned
so the caller records it in run.json. So is a lease whose holder's pid is gone from this very
host (a killed `far run`): it is taken over at once instead of after the lease's lifetime.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from schemas.record import LeaseHolder
from stages.core import storage
from stages.core.sessions import LeaseLost

log = logging.getLogger(__name__)
LEASE_NAME = "lease.json"
DEFAULT_TTL_SECONDS = 300.0  # a holder that stops renewing for this long is presumed dead
DEFAULT_WAIT_SECONDS = 0.0


class LeaseHeld(RuntimeError):
    """Another live session holds the run's lease."""

    def __init__(self, run_uri: str, holder: LeaseHolder) -> None:
        self.holder = holder
        super().__init__(
            f"run {run_uri} is being worked on by host {holder.host} pid {holder.pid} "
            f"(flow run {holder.flow_run_id or 'none'}), lease until "
            f"{holder.expires_at.isoformat()}; one writer per run: wait for it to finish, "
            f"or wait longer with --lease-wait"
        )


@dataclass
class Lease:
    """A held lease; `took_over` is the dead holder this acquisition replaced, if any."""

    uri: str
    holder: LeaseHolder
    version: str
    ttl: float
    took_over: LeaseHolder | None = None
    took_over_reason: str | None = None  # "expired" or "pid N is gone from this host"
    lost: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def renew(self) -> None:
        """Push the expiry forward; raises LeaseLost if the lease is no longer ours."""
        with self._lock:  # the heartbeat and a commit's fence both renew
            overdue = (datetime.now(UTC) - self.holder.expires_at).total_seconds()
            if overdue > 0:  # this process was stopped (SIGSTOP, a frozen VM) or starved
                log.warning("renewing the run lease %s %.0f s after it expired", self.uri, overdue)
            if self.lost.is_set():
                raise LeaseLost(f"lost the run lease {self.uri}: another session took it over")
            renewed = self.holder.model_copy(update={"expires_at": _expiry(self.ttl)})
            if not storage.replace_if_version(self.uri, _bytes(renewed), self.version):
                self.lost.set()
                raise LeaseLost(f"lost the run lease {self.uri}: another session took it over")
            current = storage.read_versioned(self.uri)
            token = None if current is None else LeaseHolder.model_validate_json(current[0]).token
            if current is None or token != renewed.token:
                self.lost.set()
                raise LeaseLost(f"lost the run lease {self.uri} while renewing it")
            self.holder, self.version = renewed, current[1]

    def check(self) -> None:
        """The fence before a commit: renews the lease by a conditional replace on the version
        this session holds, so it commits only while the lease is still its own (and for a
        lifetime from now); raises LeaseLost otherwise. (The commit that follows is a separate
        write: a takeover in between is possible only after a full lifetime without renewal.)"""
        self.renew()

    def release(self) -> None:
        if not storage.replace_if_version(self.uri, None, self.version):
            log.warning("run lease %s was no longer ours at release", self.uri)


def lease_uri(run_uri: str) -> str:
    return storage.join(run_uri, LEASE_NAME)


def acquire(
    run_uri: str,
    flow_run_id: str | None,
    wait_seconds: float = DEFAULT_WAIT_SECONDS,
    ttl: float = DEFAULT_TTL_SECONDS,
    poll_seconds: float = 1.0,
) -> Lease:
    """Take the run's lease, waiting up to `wait_seconds` for a live holder to release it."""
    uri = lease_uri(run_uri)
    give_up = time.monotonic() + wait_seconds
    while True:
        mine = _holder(flow_run_id, ttl)
        if storage.create_exclusive(uri, _bytes(mine)):
            return _confirmed(uri, mine, ttl, None)
        current = storage.read_versioned(uri)
        if current is not None:
            holder = LeaseHolder.model_validate_json(current[0])
            reason = _abandoned(holder)
            if reason is not None:
                if storage.replace_if_version(uri, _bytes(mine), current[1]):
                    log.warning("took over the run lease of %s: %s", _describe(holder), reason)
                    return _confirmed(uri, mine, ttl, holder, reason)
                continue  # someone else changed it meanwhile: look again
            if time.monotonic() >= give_up:
                raise LeaseHeld(run_uri, holder)
        time.sleep(poll_seconds)


@contextmanager
def held(
    run_uri: str,
    flow_run_id: str | None,
    wait_seconds: float = DEFAULT_WAIT_SECONDS,
    ttl: float = DEFAULT_TTL_SECONDS,
    on_lost: Callable[[LeaseLost], None] | None = None,
) -> Iterator[Lease]:
    """Hold the run's lease for the body, renewed every ttl/3 seconds, released at the end.

    When a renewal finds the lease taken over, `on_lost` is called (from the heartbeat thread)
    so the session stops at once (far_flow: `StopFlag.abort`, which interrupts the main
    thread); every commit also checks it (`Lease.check`). A holder stopped past the lease's
    lifetime (SIGSTOP) finds out on its first beat after SIGCONT: the beat is overdue by then."""
    lease = acquire(run_uri, flow_run_id, wait_seconds, ttl)
    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat, args=(lease, stop, on_lost), daemon=True, name="far-lease"
    )
    beat.start()
    try:
        yield lease
    finally:
        stop.set()
        beat.join()
        if not lease.lost.is_set():
            lease.release()


def _heartbeat(
    lease: Lease, stop: threading.Event, on_lost: Callable[[LeaseLost], None] | None
) -> None:
    while not stop.wait(lease.ttl / 3):
        try:
            lease.renew()
        except LeaseLost as e:
            log.error("run lease: %s; stopping this session at once", e)
            if on_lost is not None:
                on_lost(e)
            return
        except Exception as e:  # a failed renewal is retried at the next beat until expiry
            log.error("run lease heartbeat: %s", e)


def _abandoned(holder: LeaseHolder) -> str | None:
    """Why a lease may be taken over now, or None while its holder may be alive: expired, or
    held by a pid that is gone from this host (same host and PID namespace, so the pid is
    ours to check; a reused pid only means waiting for the expiry)."""
    if holder.expires_at <= datetime.now(UTC):
        return "expired"
    same_host = holder.host == socket.gethostname()
    if same_host and holder.pid_namespace is not None and holder.pid_namespace == _pid_namespace():
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return f"pid {holder.pid} is gone from this host"
        except PermissionError:  # alive, owned by another user
            return None
    return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _confirmed(
    uri: str,
    mine: LeaseHolder,
    ttl: float,
    took_over: LeaseHolder | None,
    reason: str | None = None,
) -> Lease:
    current = storage.read_versioned(uri)
    if current is None or LeaseHolder.model_validate_json(current[0]).token != mine.token:
        raise LeaseLost(f"lost the run lease {uri}: it changed hands while being acquired")
    return Lease(uri, mine, current[1], ttl, took_over, reason)


def _holder(flow_run_id: str | None, ttl: float) -> LeaseHolder:
    now = datetime.now(UTC)
    return LeaseHolder(
        token=uuid.uuid4().hex,
        host=socket.gethostname(),
        pid=os.getpid(),
        flow_run_id=flow_run_id,
        acquired_at=now,
        expires_at=now + timedelta(seconds=ttl),
        pid_namespace=_pid_namespace(),
    )


def _expiry(ttl: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=ttl)


def _bytes(holder: LeaseHolder) -> bytes:
    return holder.model_dump_json(indent=2).encode()


def _describe(holder: LeaseHolder) -> str:
    return f"host {holder.host} pid {holder.pid} flow run {holder.flow_run_id or 'none'}"
