"""The lease's write fence on TensorBoard event files (stages/core/metrics_logging.TensorBoard),
with real tensorboardX records, real jax.monitoring listeners and a real full disk: once the
session may no longer write its stage (another session holds the lease, or committed the
stage), not one more event byte reaches the stage directory, whether the records were logged
before or after the lease was lost; a closed backend that JAX still calls writes nothing."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest

from stages.core import metrics_logging, sessions
from stages.core.sessions import LeaseLost


class Lease:
    """A write fence whose lease is lost when the test says so (as run_stage's fence raises)."""

    def __init__(self) -> None:
        self.lost = False

    def check(self) -> None:
        if self.lost:
            raise LeaseLost("the run lease was taken over by pid 1234 (test)")


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_a_record_logged_after_the_lease_is_lost_never_reaches_the_file(tmp_path: Path) -> None:
    lease = Lease()
    with sessions.fencing(lease.check):
        board = metrics_logging.TensorBoard(str(tmp_path), flush_secs=0)  # each record at once
        for step in range(3):
            board.log_scalar("/train/loss", 1.0, step=step)
        written = files(tmp_path)
        lease.lost = True
        with pytest.raises(LeaseLost, match="taken over"):
            board.log_scalar("/train/loss", 1.0, step=3)
        board.close()
    assert len(written) == 1 and files(tmp_path) == written


def test_records_pending_when_the_lease_is_lost_are_dropped_not_flushed(tmp_path: Path) -> None:
    """Records logged while the lease was held but not yet flushed (a holder frozen between
    two flushes) are never written once it is lost: not at close, not at the process's end."""
    lease = Lease()
    with sessions.fencing(lease.check):
        board = metrics_logging.TensorBoard(str(tmp_path))
        for step in range(3):
            board.log_scalar("/train/loss", 1.0, step=step)
        header_only = files(tmp_path)
        lease.lost = True
        with pytest.raises(LeaseLost, match="taken over"):
            board.close()
    assert files(tmp_path) == header_only
    del board  # what the interpreter's exit would do: nothing buffered is left to flush
    assert files(tmp_path) == header_only


def test_a_closed_backend_that_jax_still_calls_writes_nothing(tmp_path: Path) -> None:
    board = metrics_logging.TensorBoard(str(tmp_path))
    jax.monitoring.register_scalar_listener(board.log_scalar)
    try:
        board.log_scalar("/train/loss", 1.0, step=1)
        board.close()
        closed = files(tmp_path)
        for step in range(3):
            jax.monitoring.record_scalar("/far/test/probe", 1.0, step=10 + step)
        board.close()  # a second close writes nothing either
    finally:
        jax.monitoring.unregister_scalar_listener(board.log_scalar)
    assert files(tmp_path) == closed
    [(_, written)] = closed.items()
    assert b"train/loss" in written and b"far/test/probe" not in written
