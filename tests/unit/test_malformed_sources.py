"""Malformed data files: each is refused with an InputError that names the file and what was
expected (never a raw decoder error), or its bad rows are quarantined with their row."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.recipe import SourceSpec
from stages.core.errors import InputError
from stages.data_prep import build as data_prep
from stages.data_prep.sources import read_rows

ROW = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}


def _gz(data: bytes) -> bytes:
    return gzip.compress(data)


def _parquet() -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([ROW]), out)
    return out.getvalue()


# (file name, content, what the error must say) for files that cannot be read at all
UNREADABLE: list[tuple[str, bytes, str]] = [
    ("empty.jsonl", b"", r"empty\.jsonl is empty; expected rows of JSON lines"),
    ("blank.json", b"  \n", r"blank\.json is empty; expected rows of a JSON list"),
    ("text.json", b"question,answer\n1,2\n", r"text\.json is not valid JSON at line 1"),
    ("object.json", json.dumps(ROW).encode(), r"object\.json holds a JSON dict; expected a list"),
    ("latin1.json", b'[{"question": "caf\xe9"}]', r"latin1\.json is not valid UTF-8"),
    ("plain.jsonl.gz", json.dumps(ROW).encode(), r"plain\.jsonl\.gz is not a complete gzip"),
    ("cut.jsonl.gz", _gz(json.dumps(ROW).encode() * 50)[:-12], r"cut\.jsonl\.gz is not a comp"),
    ("rows.parquet", b"PAR1 not really parquet PAR1", r"rows\.parquet is not a readable parq"),
    ("cut.parquet", _parquet()[:-40], r"cut\.parquet is not a readable parquet"),
    ("rows.tsv", b"question\tanswer\n", r"rows\.tsv: unknown file type; expected \.json"),
    ("header.csv", b"question,answer\n", r"header\.csv has a header and no rows; expected"),
    ("latin1.csv", b"question,answer\ncaf\xe9,1\n", r"latin1\.csv is not valid UTF-8"),
    ("twice.csv", b"question,question\nq,a\n", r"twice\.csv: its header repeats .*question"),
    ("huge.csv", b"q,a\n" + b"x" * (1 << 18) + b",1\n", r"huge\.csv is not valid CSV at line 2"),
]


@pytest.mark.parametrize(("name", "content", "message"), UNREADABLE, ids=[u[0] for u in UNREADABLE])
def test_unreadable_file_names_itself(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    (tmp_path / name).write_bytes(content)
    spec = SourceSpec(kind="file", name=str(tmp_path / name), adapter="gsm8k")
    with pytest.raises(InputError, match=message):
        list(read_rows(spec, 0))


# (file name, content, the row and reason the error must name) when no row is usable
ALL_BAD: list[tuple[str, bytes, str]] = [
    ("missing.jsonl", b'{"question": "x"}\n', r"row 0: missing field 'answer'"),
    ("types.jsonl", b'{"question": 5, "answer": "#### 5"}\n', r"row 0: field 'question' is int"),
    ("lines.jsonl", b"not json\n[1]\n", r"row 0: line 1 is not valid JSON.*\(and 1 more\)"),
    ("scalars.json", b"[1, 2]", r"row 0: row 0 is not a JSON object"),
]


@pytest.mark.parametrize(("name", "content", "message"), ALL_BAD, ids=[a[0] for a in ALL_BAD])
def test_source_without_usable_rows_names_file_and_row(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    (tmp_path / name).write_bytes(content)
    spec = SourceSpec(kind="file", name=str(tmp_path / name), adapter="gsm8k")
    with pytest.raises(InputError, match=rf"{name}.*none of its \d+ rows is usable; {message}"):
        data_prep.load_source(spec, 0, data_prep.Quarantine(), data_prep.Deduper())


def test_reason_kinds_keep_digits_inside_names() -> None:
    quarantine = data_prep.Quarantine()
    quarantine.add("file/a", "line 3 is not valid UTF-8")
    quarantine.add("file/a", "line 17 is not valid UTF-8")
    quarantine.add("file/a", "duplicate (exact) of file/gsm8k_duplicates.jsonl:0123abcd")
    quarantine.add("file/a", "oversize: 300 tokens > max_seq_len 160")
    assert quarantine.by_reason() == {
        "line N is not valid UTF-8": 2,
        "duplicate (exact) of file/gsm8k_duplicates.jsonl": 1,
        "oversize": 1,
    }


def test_quarantine_is_written_when_a_split_ends_up_empty(tmp_path: Path) -> None:
    from stages.core import storage
    from stages.core.runner import RunContext
    from tests.conftest import recipe_with

    only_row = tmp_path / "long.jsonl"
    only_row.write_text(json.dumps({**ROW, "question": "Long? " + "x" * 400}) + "\n")
    source = {"kind": "file", "name": str(only_row), "adapter": "gsm8k"}
    recipe = recipe_with(str(tmp_path / "runs"), data={"sft": {"size": 1, "sources": [source]}})
    ctx = RunContext(root=recipe.storage_root, run=recipe.name)
    with pytest.raises(InputError, match=r"split 'sft_train' is empty.*quarantine\.jsonl") as e:
        data_prep.prepare(recipe.data, recipe.model, ctx)
    uri = str(e.value).rsplit(": ", 1)[1]
    rows = [json.loads(line) for line in storage.read_text(uri).splitlines()]
    assert [r["reason"].split(":")[0] for r in rows if r["source"] == "file/long.jsonl"] == [
        "oversize"
    ]


def test_a_row_nested_too_deeply_is_quarantined_alone(tmp_path: Path) -> None:
    """On main json.loads raised RecursionError out of data_prep: one row ended the run."""
    deep = '{"question": "q", "answer": "#### 1", "x": ' + "[" * 200_000 + "]" * 200_000 + "}"
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + deep + "\n")
    spec = SourceSpec(kind="file", name=str(path), adapter="gsm8k")
    quarantine = data_prep.Quarantine()
    examples = data_prep.load_source(spec, 0, quarantine, data_prep.Deduper())
    assert [e.answer for e in examples] == ["5"]
    assert quarantine.rows == [
        {"source": "file/deep.jsonl", "reason": "line 2 is nested too deeply to parse", "index": 1}
    ]
    as_list = tmp_path / "deep.json"
    as_list.write_text("[" + deep + "]")
    with pytest.raises(InputError, match=r"deep\.json is nested too deeply to parse"):
        list(read_rows(SourceSpec(kind="file", name=str(as_list), adapter="gsm8k"), 0))


OVERSIZE = """
import json, resource, sys
from schemas.recipe import SourceSpec
from stages.data_prep import build as data_prep
spec = SourceSpec(kind="file", name=sys.argv[1], adapter="gsm8k")
quarantine = data_prep.Quarantine()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
examples = data_prep.load_source(spec, 0, quarantine, data_prep.Deduper())
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps([len(examples), quarantine.rows, grew << 10]))
"""


@pytest.mark.parametrize("name", ["huge.jsonl", "huge.jsonl.gz"])
def test_an_oversize_row_is_quarantined_before_it_is_parsed(tmp_path: Path, name: str) -> None:
    """A 30 MB row of small objects: on main the reader held the file (twice) and parsed the
    row (about 1.4 GB of peak memory) before quarantining it by its token count. Measured in
    a process of its own: its peak memory grows by less than the row."""
    import subprocess
    import sys

    huge = '{"question": "Big?", "answer": "#### 1", "pad": [' + "{}," * 10_000_000 + "{}]}"
    content = (json.dumps(ROW) + "\n" + huge + "\n").encode()
    (tmp_path / name).write_bytes(_gz(content) if name.endswith(".gz") else content)
    run = subprocess.run(
        [sys.executable, "-c", OVERSIZE, str(tmp_path / name)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    used, rows, grew = json.loads(run.stdout.splitlines()[-1])
    reason = "oversize: line 2 is over 1048576 bytes; not parsed"
    assert (used, rows) == (1, [{"source": f"file/{name}", "reason": reason, "index": 1}])
    assert grew < 20 << 20, f"peak memory grew by {grew >> 20} MiB reading a 30 MB row"


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_capped_lines_cut_at_the_limit_whatever_the_chunks(chunk: int) -> None:
    from stages.core.storage import capped_lines

    data = b"abc\n" + b"x" * 10 + b"\n\n12345\nlast"
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    assert list(capped_lines(chunks, 5)) == [b"abc", None, b"", b"12345", b"last"]
    assert list(capped_lines([b"123456"], 5)) == [None]
