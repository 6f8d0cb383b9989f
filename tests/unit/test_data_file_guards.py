"""Odd data files and rows: a FIFO or a link to a device is refused by `far validate` naming
the file (it never blocks), as is a file over the size cap; a lone surrogate quarantines its
row with the reason; a byte-order mark is not part of the first row; a short split and the
quarantined rows are each one line on the console."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from schemas.recipe import SourceSpec
from stages.core.errors import InputError
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.data_prep import fingerprints, sources
from tests.conftest import BIN, recipe_with, smoke_data

ROW = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}


def _rows(n: int) -> list[dict[str, str]]:
    return [{"question": f"What is {i} + 3?", "answer": f"{i} + 3\n#### {i + 3}"} for i in range(n)]


def _validate(tmp_path: Path, data_file: Path) -> subprocess.CompletedProcess[str]:
    data = smoke_data()
    data["data"]["eval"] = {
        "size": 2,
        "sources": [{"kind": "file", "name": str(data_file), "adapter": "gsm8k"}],
    }
    data["storage_root"] = str(tmp_path / "runs")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data))
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    return subprocess.run(
        [str(BIN / "far"), "validate", str(recipe)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # the reader blocked for ever on these before
    )


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_fifo_or_a_device_as_a_data_file_is_refused_not_read(tmp_path: Path, kind: str) -> None:
    data_file = tmp_path / "rows.jsonl"
    if kind == "fifo":
        os.mkfifo(data_file)
        what = "a FIFO (named pipe)"
    else:
        data_file.symlink_to("/dev/zero")
        what = "a character device"
    done = _validate(tmp_path, data_file)
    assert done.returncode == 2, done.stderr
    assert f"data source {data_file}" in done.stderr and f"is {what}, not a regular file" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr


def test_a_data_file_over_the_size_cap_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(4)))
    monkeypatch.setattr(sources, "MAX_DATA_FILE_BYTES", 64)
    spec = SourceSpec(kind="file", name=str(path), adapter="gsm8k")
    with pytest.raises(InputError, match=rf"rows\.jsonl is {path.stat().st_size} bytes, over"):
        list(sources.read_rows(spec, 0))
    with pytest.raises(InputError, match="over the 64 byte limit"):
        fingerprints.source_fingerprint(spec)


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json"])
def test_a_lone_surrogate_quarantines_its_row(tmp_path: Path, name: str) -> None:
    rows = [json.dumps(r) for r in _rows(3)]
    rows[1] = rows[1].replace("What is", "What\\ud800 is")  # half a pair, alone
    paired = json.dumps({**ROW, "question": "Smile \\ud83d\\ude00 2 + 3?"}).replace("\\\\", "\\")
    text = "\n".join([*rows, paired]) + "\n" if name.endswith("l") else f"[{','.join(rows)}]"
    (tmp_path / name).write_text(text)
    spec = SourceSpec(kind="file", name=str(tmp_path / name), adapter="gsm8k")
    quarantine = data_prep.Quarantine()
    examples = data_prep.load_source(spec, 0, quarantine, data_prep.Deduper())
    assert len(examples) == (3 if name.endswith("l") else 2)  # a whole pair is fine
    assert [r["reason"] for r in quarantine.rows] == [
        f"{'line 2' if name.endswith('l') else 'row 1'} holds a lone surrogate (U+D800), not "
        f"valid Unicode text"
    ]


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json"])
def test_a_byte_order_mark_is_not_part_of_the_first_row(tmp_path: Path, name: str) -> None:
    lines = [json.dumps(r) for r in _rows(3)]
    text = "\n".join(lines) + "\n" if name.endswith("l") else f"[{','.join(lines)}]"
    (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
    spec = SourceSpec(kind="file", name=str(tmp_path / name), adapter="gsm8k")
    quarantine = data_prep.Quarantine()
    examples = data_prep.load_source(spec, 0, quarantine, data_prep.Deduper())
    assert len(examples) == 3 and quarantine.rows == []


def test_a_short_split_and_the_quarantine_are_one_console_line_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = _rows(30)
    rows[3]["question"] = "long " * 80 + "question?"
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*rows, rows[0]]))
    source = {"kind": "file", "name": str(path), "adapter": "gsm8k"}
    recipe = recipe_with(
        str(tmp_path),
        data={
            "eval": {"size": 4, "sources": [source]},
            "grpo": {"size": 4, "sources": [source]},
            "sft": {"size": 40, "sources": [source]},
        },
    )
    with caplog.at_level(logging.INFO, logger="stages.data_prep.build"):
        dataset = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path), "r"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data_prep:")]
    sft = dataset.output.split_sizes["sft_train"]
    assert f"data_prep: split sft_train has {sft} of 40 rows" in "\n".join(lines)
    quarantined = [line for line in lines if "rows quarantined" in line]
    assert len(quarantined) == 1
    assert quarantined[0].startswith(f"data_prep: {dataset.output.quarantined} rows quarantined (")
    assert "oversize" in quarantined[0] and "quarantine.jsonl" in quarantined[0]
