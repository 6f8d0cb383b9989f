"""`far export` exports only what the records vouch for, into a directory it replaces whole, and
`far lineage --openlineage` writes only to regular files: a tampered checkpoint, a mixed export
directory, a partial export and a FIFO or device as the events file.

Runs are real `run_stage` calls on small files (tests/unit/test_records.py's `make_run`); the
refusals all come before the model code is imported, so no checkpoint needs to restore. The
staging and publishing of an export run on plain files, on a real full disk (a tmpfs) and
with a real SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from flows import cli
from pipeline import lineage
from stages.core import ledger, storage
from stages.core.errors import InputError
from stages.core.records import directory_digests, find_checkpoint_record
from stages.modeling import export_card, export_target
from tests.unit.test_full_disk import fill, small_disk  # noqa: F401  (a fixture)
from tests.unit.test_records import make_run, rebuild_ledger, reseal

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run(tmp_path: Path) -> dict[str, Any]:
    return make_run(tmp_path)


def far(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().err.strip()


def flip_a_byte(checkpoint_uri: str) -> Path:
    weights = Path(checkpoint_uri, "1", "w")
    data = bytearray(weights.read_bytes())
    data[3] ^= 0x01
    weights.write_bytes(bytes(data))
    return weights


def vouched(checkpoint_uri: str) -> list[str]:
    record_uri, record = find_checkpoint_record(checkpoint_uri)
    return [uri for uri, _ in reversed(export_card.upstream(record_uri, record))]


def test_a_flipped_byte_in_the_checkpoint_is_refused_naming_the_file(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = run["grpo"].output.uri
    assert lineage.export_problems(vouched(checkpoint)) == []
    weights = flip_a_byte(checkpoint)
    out = tmp_path / "hf"
    code, err = far(capsys, "export", checkpoint, str(out))
    assert code == cli.EXIT_PROBLEMS
    assert "\n" not in err and f"{weights}: altered" in err, err
    assert "export refused, nothing written" in err
    assert not out.exists()
    assert any(str(weights) in p for p in lineage.audit(run["ctx"].run_uri))  # audit agrees


def test_a_resealed_checkpoint_fails_the_ledger_and_a_rebuilt_ledger_the_root(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_uri = run["ctx"].run_uri
    published = str(ledger.root(run_uri))
    checkpoint = run["sft"].output.uri
    flip_a_byte(checkpoint)
    record = Path(run["sft"].record_uri)
    files = {k: v.model_dump() for k, v in directory_digests(str(record.parent)).items()}
    reseal(record, lambda d: d.update({"files": files}))
    out = tmp_path / "hf"
    code, err = far(capsys, "export", checkpoint, str(out))
    assert code == cli.EXIT_PROBLEMS and f"{record}: record differs from its ledger" in err, err
    rebuild_ledger(run_uri)  # ...and the writer recomputes the ledger too
    assert lineage.export_problems(vouched(checkpoint)) == []  # only a root can tell now
    code, err = far(capsys, "export", checkpoint, str(out), "--expect-root", published)
    assert code == cli.EXIT_PROBLEMS and f"the expected root {published}" in err, err
    assert not out.exists()


def test_an_edited_evaluation_beside_the_checkpoint_is_refused(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The card shows the evaluations beside the checkpoint: each must be its evaluation's."""
    checkpoint = run["sft"].output.uri
    sft_dir = Path(run["sft"].record_uri).parent
    eval_record = run["eval"].record_uri
    assert lineage.export_problems(vouched(checkpoint)) == []
    [evaluation] = (sft_dir / "evaluations").iterdir()
    data = json.loads(evaluation.read_text())
    data["scores"]["accuracy"] = 0.97
    evaluation.write_text(json.dumps(data))
    code, err = far(capsys, "export", checkpoint, str(tmp_path / "hf"))
    assert code == cli.EXIT_PROBLEMS and f"{evaluation}: evaluation file edited" in err, err
    reseal(Path(eval_record), lambda d: d["metrics"].update({"sft/accuracy": 0.97}))
    assert f"{eval_record}: record differs" in lineage.export_problems(vouched(checkpoint))[0]


def test_an_upstream_record_the_root_does_not_cover_is_refused(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The grpo checkpoint's card lists the sft record: an edited one stops the export."""
    sft_record = Path(run["sft"].record_uri)
    reseal(sft_record, lambda d: d["metrics"].update({"loss": 0.01}))
    code, err = far(capsys, "export", run["grpo"].output.uri, str(tmp_path / "hf"))
    assert code == cli.EXIT_PROBLEMS and f"{sft_record}: record differs" in err, err
    code, err = far(capsys, "export", run["grpo"].output.uri, "x", "--expect-root", "sha256:1")
    assert code == cli.EXIT_INVALID and "--expect-root" in err  # no root at all: exit 2


def test_export_refuses_a_foreign_directory_and_a_path_under_a_file(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = run["sft"].output.uri
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    code, err = far(capsys, "export", checkpoint, str(foreign))
    assert code == cli.EXIT_INVALID and "no far-export.json" in err, err
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    code, err = far(capsys, "export", checkpoint, str(a_file / "sub" / "hf"))
    assert code == cli.EXIT_INVALID and f"lies under {a_file}, a file" in err, err
    assert a_file.read_text() == "x"


def build(out: Path, files: dict[str, str], kind: str) -> None:
    """What export_checkpoint does around export_model, with plain files for the model."""
    with export_target.staging(str(out)) as staged:
        for rel, text in files.items():
            Path(staged, rel).parent.mkdir(parents=True, exist_ok=True)
            Path(staged, rel).write_text(text)
        export_target.write_marker(staged, {"kind": kind})
        export_target.publish(staged, str(out))


ADAPTER = {
    "adapter_config.json": "{}",
    "adapter_model.safetensors": "A",
    "base/model.safetensors": "B",
}
MERGED = {"model.safetensors": "M", "config.json": "{}"}


def test_a_merged_export_replaces_an_adapter_export_whole(tmp_path: Path) -> None:
    out = tmp_path / "hf"
    build(out, ADAPTER, "adapter")
    assert export_target.is_export(str(out))
    export_target.check(str(out))  # a previous export: accepted
    build(out, MERGED, "merged")
    assert sorted(storage.list_files(str(out))) == sorted([*MERGED, export_target.MARKER])
    assert json.loads((out / export_target.MARKER).read_text())["kind"] == "merged"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging folder left


def test_a_failed_export_leaves_the_previous_one_and_no_staging(tmp_path: Path) -> None:
    out = tmp_path / "hf"
    build(out, MERGED, "merged")
    with pytest.raises(RuntimeError), export_target.staging(str(out)) as staged:
        os.makedirs(staged)
        Path(staged, "adapter_config.json").write_text("{}")
        raise RuntimeError("stopped while building")
    assert sorted(storage.list_files(str(out))) == sorted([*MERGED, export_target.MARKER])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_an_export_onto_a_full_disk_leaves_no_partial_directory(small_disk: Path) -> None:  # noqa: F811
    out = small_disk / "hf"
    fill(small_disk, leave=8192)
    with pytest.raises(OSError) as raised:
        build(out, {"model.safetensors": "w" * 100_000}, "merged")
    assert storage.write_failure(raised.value) is not None
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_a_sigterm_removes_the_staging_folder_and_a_later_export_a_killed_ones(
    tmp_path: Path,
) -> None:
    out = tmp_path / "hf"
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from stages.modeling import export_target
        with export_target.staging({str(out)!r}) as staged:
            os.makedirs(staged)
            open(os.path.join(staged, "model.safetensors"), "w").write("partial")
            print("writing", flush=True)
            time.sleep(60)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for sig, code in [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)]:
        proc = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
        )
        assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
        assert next(p.name for p in tmp_path.iterdir()).startswith(".hf.far-export-")
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == code
    # the SIGTERMed export cleaned up after itself; the SIGKILLed one could not...
    [left] = list(tmp_path.iterdir())
    assert left.name.startswith(f".hf.far-export-{proc.pid}-")
    build(out, MERGED, "merged")  # ...the next export beside it removes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink", "device"])
def test_openlineage_writes_only_to_a_regular_file_or_a_new_path(
    kind: str, run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "events"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    elif kind == "symlink":
        (tmp_path / "real").write_text("keep")
        target.symlink_to(tmp_path / "real")
    elif os.geteuid() == 0:
        os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # a /dev/null of its own
    else:
        pytest.skip("making a device node needs root")
    mode = os.lstat(target).st_mode
    uri = run["sft"].output.uri
    code, err = far(capsys, "lineage", uri, "--openlineage", str(target))
    assert code == cli.EXIT_INVALID and err.startswith(f"far: --openlineage {target}: is a")
    assert os.lstat(target).st_mode == mode  # untouched
    if kind == "symlink":
        assert (tmp_path / "real").read_text() == "keep"


def test_openlineage_replaces_a_regular_file_and_creates_a_new_one(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = run["sft"].output.uri
    for target in (tmp_path / "old.jsonl", tmp_path / "new" / "events.jsonl"):
        if target.name == "old.jsonl":
            target.write_text("old\n")
        assert cli.main(["lineage", uri, "--openlineage", str(target), "--json"]) == 0
        lines = target.read_text().splitlines()
        assert lines and all(json.loads(line)["eventType"] for line in lines)
    capsys.readouterr()


def test_check_regular_target_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^--flag .*: is a directory"):
        storage.check_regular_target(str(tmp_path), "--flag")
