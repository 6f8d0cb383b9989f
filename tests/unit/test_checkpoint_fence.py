"""The lease's write fence on checkpoints (stages/modeling/tunix_compat.fence_checkpoint_writes),
with Tunix's real CheckpointManager and Orbax's real background commit on a tiny Flax model:
once the session may no longer write its stage (another session holds the lease, or committed
the stage), a save writes no step, a save already under way is never committed, and no older
step is deleted."""

from __future__ import annotations

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


def damaged_latest(root: Path, model: nnx.Module) -> None:
    """Steps 1 and 2 saved, then step 2's largest file (its array data) deleted."""
    ckpt = manager(root)
    for step in (1, 2):
        assert ckpt.save(step, model, force=True)
    ckpt.close()
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
