"""A storage root that fills up: every write ends the session at once, naming the file, and
leaves nothing behind (a red-team finding). On a real small filesystem (a tmpfs mounted for the
test; skipped where mounting is not permitted), with real threads, signals and processes."""

from __future__ import annotations

import ast
import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import lease
from stages.core import storage
from stages.core.runner import RunContext, StageIdentity, run_stage
from stages.core.sessions import SaveFailed

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, unmounted afterwards."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = os.geteuid() == 0 and (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
            capture_output=True,
        ).returncode
        == 0
    )
    if not mounted:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN): the test fills a real disk")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int = 0) -> None:
    """Write until the filesystem refuses (ENOSPC), then free `leave` bytes."""
    with open(disk / "filler", "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError:
            pass
        f.truncate(max(f.tell() - leave, 0))


def leftovers(disk: Path) -> list[str]:
    return sorted(str(p.relative_to(disk)) for p in disk.rglob("*.tmp-*"))


def test_a_write_on_a_full_disk_names_the_file_and_leaves_no_temporary(small_disk: Path) -> None:
    fill(small_disk)
    target = small_disk / "run" / "run.json"
    with pytest.raises(OSError) as raised:
        storage.write_json(str(target), {"x": "y" * 10_000})
    assert storage.write_failure(raised.value) == f"{target}: No space left on device"
    assert leftovers(small_disk) == []


def test_a_lease_renewed_on_a_full_disk_leaves_no_temporary(small_disk: Path) -> None:
    held = lease.acquire(str(small_disk / "run"), "flow")
    fill(small_disk)
    with pytest.raises(OSError):
        held.renew()
    assert leftovers(small_disk) == []
    held.release()  # deleting needs no space: nothing of the lease stays
    assert not (small_disk / "run" / lease.LEASE_NAME).exists()


def test_a_stage_whose_write_is_refused_ends_with_save_failed(small_disk: Path) -> None:
    ctx = RunContext(root=str(small_disk), run="run")

    def work(directory: str) -> tuple[Any, dict[str, float], dict[str, list[float]]]:
        fill(small_disk)
        storage.write_bytes(f"{directory}/checkpoints/1/data", b"w" * 100_000)
        return None, {}, {}

    with pytest.raises(SaveFailed, match=r"stage sft could not save in .*/run/sft-[0-9a-f]{12}: "):
        run_stage(ctx, StageIdentity("sft", 1, {}, {}), work)


def test_a_training_curve_written_on_a_full_disk_ends_the_stage_with_save_failed(
    small_disk: Path,
) -> None:
    """FAR's TensorBoard backend writes its events on the caller's thread (behind the lease's
    fence): a full disk raises there, and the stage ends with SaveFailed naming the file."""
    from stages.core.metrics_logging import TensorBoard

    ctx = RunContext(root=str(small_disk), run="run")

    def work(directory: str) -> tuple[Any, dict[str, float], dict[str, list[float]]]:
        board = TensorBoard(f"{directory}/logs", flush_secs=0)
        fill(small_disk)
        for step in range(1000):
            board.log_scalar("/train/loss", float(step), step=step)
        return None, {}, {}

    with pytest.raises(SaveFailed, match=r"/logs/events\.out\.tfevents.*No space left on device"):
        run_stage(ctx, StageIdentity("sft", 1, {}, {}), work)


def test_a_failed_async_orbax_save_is_raised_at_the_next_step(small_disk: Path) -> None:
    """Orbax's background save fails on a full disk; Tunix would only meet it at the next
    save, many steps on: the training loop's health check raises it at once."""
    import numpy as np
    import orbax.checkpoint as ocp

    from stages.modeling import tunix_compat

    manager = ocp.CheckpointManager(str(small_disk / "checkpoints"))
    fill(small_disk, leave=64 * 1024)  # room for the save's metadata, not for its arrays
    weights = np.random.default_rng(0).random((256, 256), np.float32)  # 256 KiB, incompressible
    manager.save(1, args=ocp.args.StandardSave({"w": weights}))

    class Trainer:  # Tunix's trainer exposes its CheckpointManager wrapper like this
        class checkpoint_manager:
            _checkpoint_manager = manager

    with pytest.raises(Exception) as raised:
        for _ in range(200):  # the save thread fails within moments
            tunix_compat.raise_save_errors(Trainer)
            time.sleep(0.05)
    assert "No space left on device" in str(storage.write_failure(raised.value))
    with contextlib.suppress(ValueError):  # closing joins the failed save again
        manager.close()


def _name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _called(node: ast.AST) -> set[str]:
    """The names of the functions called anywhere inside `node`."""
    return {_name(n) for n in ast.walk(node) if isinstance(n, ast.Call)}


def test_every_training_loop_checks_for_a_failed_async_save() -> None:
    """Every stage that trains a Tunix trainer (SFT, GRPO, DPO, distill) feeds it through the
    one training tail, whose `guarded` stream passes the health hook that raises its trainer's
    failed Orbax background save (the test above): a full disk ends any training stage within
    a step, not only SFT. Read from the source: a real run of each on a filling disk costs
    minutes; SFT's is the one measured end to end."""
    wired, tails = {}, set()
    for path in sorted((REPO / "stages").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _name(node) == "guarded":
                health = [k.value for k in node.keywords if k.arg == "health"]
                wired[relative] = bool(health) and "raise_save_errors" in _called(health[0])
            if isinstance(node, ast.Call) and _name(node) in {"TrainingTail", "for_trainer"}:
                tails.add(relative)
    assert wired == {"stages/modeling/training_tail.py": True}
    assert tails == {
        "stages/distill.py",
        "stages/dpo.py",
        "stages/grpo/training.py",
        "stages/sft.py",
    }


# A training loop's metrics writer (tensorboardX, as Tunix's metrics logger uses it) on a disk
# that fills: its writer thread dies on ENOSPC and the main thread blocked for ever on its
# full queue (measured on `far run`: 0% CPU for minutes, SIGTERM and Ctrl-C ignored).
WRITER_ON_A_FULL_DISK = textwrap.dedent(
    """
    import sys
    from stages.core.sessions import StopFlag, stop_on_sigterm
    from tensorboardX import SummaryWriter

    disk = sys.argv[1]
    with stop_on_sigterm(StopFlag()):
        writer = SummaryWriter(disk)
        with open(disk + "/filler", "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"x" * 4096)
            except OSError:
                pass
        try:
            for step in range(1_000_000):
                writer.add_scalar("loss", float(step), step)
        except Exception as e:
            print(f"ended: {type(e).__name__}: {e}", flush=True)
            sys.exit(3)
    """
)


def test_a_writer_thread_that_dies_on_a_full_disk_ends_the_session(small_disk: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER_ON_A_FULL_DISK, str(small_disk)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the session hung on the dead writer thread's full queue")
    assert proc.returncode == 3
    assert "ended: SaveFailed: a background write" in out.decode()
    assert "No space left on device" in out.decode()
