"""The lease's write fence on checkpoints (stages/modeling/tunix_compat.fence_checkpoint_writes),
with Tunix's real CheckpointManager and Orbax's real background commit on a tiny Flax model:
once the session may no longer write its stage (another session holds the lease, or committed
the stage), a save writes no step, a save already under way is never committed, and no older
step is deleted."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from pathlib import Path

import orbax.checkpoint as ocp
import pytest
from flax import nnx
from tunix.sft import checkpoint_manager as tunix_ckpt

from stages.core import sessions
from stages.core.sessions import LeaseLost
from stages.modeling import tunix_compat  # importing it installs the fence


class Lease:
    """A write fence whose lease is lost when the test says so (as run_stage's fence raises)."""

    def __init__(self) -> None:
        self.lost = False

    def check(self) -> None:
        if self.lost:
            raise LeaseLost("the run lease was taken over by pid 1234 (test)")


def manager(root: Path, keep: int | None = None) -> tunix_ckpt.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True)
    return tunix_ckpt.CheckpointManager(str(root), options)


def committed_steps(root: Path) -> list[str]:
    """Step directories Orbax committed (an uncommitted save is a `*.orbax-checkpoint-tmp*`)."""
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.isdigit())


@pytest.fixture
def model() -> nnx.Module:
    return nnx.Linear(4, 4, rngs=nnx.Rngs(0))


def test_the_fence_is_installed_on_the_classes_every_trainer_saves_through() -> None:
    assert getattr(tunix_ckpt.CheckpointManager.save, "_far_fenced", False)
    tunix_compat.fence_checkpoint_writes()  # idempotent: installed once per process
    assert not getattr(tunix_ckpt.CheckpointManager.save.__wrapped__, "_far_fenced", False)


def test_a_save_after_the_lease_is_lost_writes_no_step(tmp_path: Path, model: nnx.Module) -> None:
    lease = Lease()
    ckpt = manager(tmp_path)
    with sessions.fencing(lease.check):
        assert ckpt.save(1, model, force=True)
        ckpt._checkpoint_manager.wait_until_finished()
        lease.lost = True
        with pytest.raises(LeaseLost, match="taken over"):
            ckpt.save(2, model, force=True)
    assert committed_steps(tmp_path) == ["1"]
    assert not list(tmp_path.glob("2*"))  # not even a temporary directory


def test_a_save_under_way_when_the_lease_is_lost_is_never_committed(
    tmp_path: Path, model: nnx.Module
) -> None:
    """Orbax commits in a background thread (a rename here, a commit file on gs://): a session
    that lost its lease between starting a save and its commit leaves the step uncommitted,
    and the older step that max_to_keep would delete stays."""
    lease = Lease()
    ckpt = manager(tmp_path, keep=1)
    orbax = ckpt._checkpoint_manager
    with sessions.fencing(lease.check):
        assert ckpt.save(1, model, force=True)
        orbax.wait_until_finished()
        lease.lost = True
        # the save's start passed the fence; the commit after the lease is lost must not
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sessions, "check_writes", _passes_once(sessions.check_writes))
            assert ckpt.save(2, model, force=True)
        with pytest.raises(Exception) as raised:
            orbax.wait_until_finished()
    assert "taken over" in repr(raised.value) + repr(raised.value.__cause__)
    assert committed_steps(tmp_path) == ["1"]  # step 2 uncommitted, step 1 not deleted


def _passes_once(check: object) -> object:
    """The fence as it was when the save started: passed once (before the lease was lost)."""
    calls = {"n": 0}

    def check_writes(within: float = 0.0) -> None:
        calls["n"] += 1
        if calls["n"] > 1:
            check(within)  # type: ignore[operator]

    return check_writes


def damaged_latest(root: Path, model: nnx.Module, every_data_file: bool = False) -> None:
    """Steps 1 and 2 saved, then step 2's largest file (its array data) deleted, or every
    data file."""
    ckpt = manager(root)
    for step in (1, 2):
        assert ckpt.save(step, model, force=True)
    ckpt.close()
    if every_data_file:
        for data in (root / "2").rglob("d/*"):
            data.unlink()
        return
    victim = max(
        (p for p in (root / "2").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    victim.unlink()


def test_a_damaged_step_is_not_moved_aside_once_the_lease_is_lost(
    tmp_path: Path, model: nnx.Module
) -> None:
    """Setting a damaged latest step aside (restore_newest_intact) renames it inside the stage
    directory: a write like any other, refused once the session may no longer write."""
    root = tmp_path / "checkpoints"
    damaged_latest(root, model)
    lease = Lease()
    lease.lost = True
    with sessions.fencing(lease.check), pytest.raises(LeaseLost, match="taken over"):
        manager(root).maybe_restore(model)
    assert committed_steps(root) == ["1", "2"]
    assert not (tmp_path / f"checkpoints{tunix_compat.DAMAGED_SUFFIX}").exists()
    with sessions.fencing(Lease().check):  # held: the step is set aside, step 1 restores
        assert manager(root).maybe_restore(model)[0] == 1
    assert committed_steps(root) == ["1"]
    assert (tmp_path / f"checkpoints{tunix_compat.DAMAGED_SUFFIX}" / "2").is_dir()


class _LeftOver:
    """What a failed Orbax read leaves behind: a callback run after the read's event loop
    closed. Raised in __del__, its error is unraisable: Python prints it as a traceback."""

    def __init__(self, error: type[Exception] | None = None) -> None:
        self.loop, self.error = asyncio.new_event_loop(), error
        self.loop.close()

    def __del__(self) -> None:
        if self.error is not None:
            raise self.error("something else")
        self.loop.call_soon_threadsafe(print)  # RuntimeError: Event loop is closed


def test_a_failed_reads_leftovers_go_to_the_log_not_the_console(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before the hook is installed (at the first restore), a leftover is printed; from then
    on (for the rest of the process: the leftovers come whenever TensorStore's threads let go
    of them), it goes to the log, while any other unraisable error is printed as before."""
    printed: list[str] = []  # what Python's hook would print
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "unraisablehook", lambda u: printed.append(str(u.exc_value)))
        with caplog.at_level(logging.DEBUG, "stages.modeling.tunix_compat"):
            _LeftOver()  # no read has failed: printed as before
            tunix_compat.quiet_failed_reads()
            tunix_compat.quiet_failed_reads()  # installed once: not a hook around a hook
            _LeftOver()
            _LeftOver(ValueError)  # not a failed read's: printed as before
            _LeftOver()
    assert printed == ["Event loop is closed", "something else"]
    records = [r for r in caplog.records if "a failed checkpoint read left" in r.message]
    assert len(records) == 2
    assert all(r.levelno == logging.DEBUG and r.exc_info is not None for r in records)


class Layers(nnx.Module):
    def __init__(self) -> None:
        self.layers = nnx.List([nnx.Linear(64, 64, rngs=nnx.Rngs(i)) for i in range(24)])


def test_a_damaged_step_is_said_in_one_line_without_orbax_tracebacks(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The real fallback, every data file of the latest step deleted: FAR's one line, and not
    one traceback from the reads Orbax left under way (they appear in some runs only)."""
    root, layers = tmp_path / "checkpoints", Layers()  # many arrays: many reads under way
    damaged_latest(root, layers, every_data_file=True)
    with pytest.MonkeyPatch.context() as patch:  # Python's own hook (pytest's would collect)
        patch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
        assert manager(root).maybe_restore(layers)[0] == 1
        gc.collect()  # a read coroutine in a reference cycle is collected now, not later
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_a_leftover_that_comes_before_the_failed_read_raises_is_not_printed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The order CI met once: a TensorStore thread let go of a leftover while Orbax's failed
    read was still under way. Here Orbax's restore leaves one, then reads the damaged step."""
    root, model = tmp_path / "checkpoints", nnx.Linear(4, 4, rngs=nnx.Rngs(0))
    damaged_latest(root, model)
    ckpt = manager(root)
    orbax_restore = ckpt._checkpoint_manager.restore

    def restore(*args: object, **kwargs: object) -> object:
        _LeftOver()  # unraisable now, before the read below raises
        return orbax_restore(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:  # Python's own hook (pytest's would collect)
        patch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
        patch.setattr(ckpt._checkpoint_manager, "restore", restore)
        assert ckpt.maybe_restore(model)[0] == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Event loop is closed" not in err, err


def test_a_mirror_published_after_the_lease_is_lost_uploads_nothing(tmp_path: Path) -> None:
    """A remote stage (gs://; memory:// here) gets its logs, and on other protocols its
    checkpoints, from a local mirror uploaded at the end of a session: each file is a write
    under the stage directory, which asks the stage's guard (storage.guarding, as run_stage
    sets it) first, so a holder that lost its lease mid-upload writes no more files."""
    from stages.core import checkpoints, storage

    mirror = tmp_path / "mirror"
    for name in ("a.tfevents", "b.tfevents", "c.json"):
        (mirror / "logs").mkdir(parents=True, exist_ok=True)
        (mirror / "logs" / name).write_bytes(b"x")
    lease = Lease()
    writes: list[str] = []

    def check() -> None:
        lease.check()
        writes.append("checked")
        lease.lost = len(writes) == 2  # lost while the second file is written

    stage = "memory://fence-test/run/sft-0123456789ab"
    uri = f"{stage}/logs"
    with storage.guarding(stage, check), pytest.raises(LeaseLost):
        checkpoints.publish_session(
            "SFT", 2, 2, str(mirror / "ck"), f"{stage}/ck", str(mirror / "logs"), uri
        )
    assert len(storage.list_files(uri)) == 2  # the third file was never written
