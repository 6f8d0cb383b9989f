"""Where `far export` writes: a new directory, or a previous FAR export that it replaces whole.

An export is many files that other tools read together: transformers applies an
adapter_config.json it finds beside merged weights, so files left from an earlier export of
another kind give a different model. So an export never writes into a directory it did not
make: the target is new, empty, or a previous FAR export (recognized by MARKER, which every
export writes), and it is replaced as a whole. A local export is built in a staging folder
beside the target (same filesystem) and renamed into place, so a failure (a full disk, a
stop) leaves the target as it was and no partial directory. A staging folder names the
process that made it; one whose process is gone (a SIGKILLed export) is removed by the next
export beside it. Object stores have no rename: the files are uploaded, the previous
export's other files deleted, and the marker written last.

No JAX here: `far export` checks its target with this before importing the model code.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from stages.core import storage
from stages.core.errors import InputError

MARKER = "far-export.json"
"""Written into every export; a directory holding it is a previous FAR export."""
_STAGING = ".far-export-"  # staging folders: .{name}.far-export-{pid}-{random}


def check(out_uri: str) -> None:
    """Refuse a target that is a file, lies under a file, or is a non-empty directory that is
    no FAR export: before any model is built, nothing written."""
    storage.check_export_target(out_uri)
    if storage.protocol(out_uri) == "file":
        _check_ancestors(storage.normalize(out_uri))
    if storage.list_files(out_uri) and not is_export(out_uri):
        raise InputError(
            f"export target {out_uri} is a non-empty directory that no FAR export wrote (it "
            f"has no {MARKER}): an export replaces its target whole; give a new or empty "
            f"directory, or a previous export's"
        )


def _check_ancestors(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise InputError(
            f"export target {path} lies under {parent}, a file; give a directory path whose "
            f"parents are directories"
        )


def is_export(out_uri: str) -> bool:
    """Whether `out_uri` holds a FAR export's marker."""
    marker = storage.join(out_uri, MARKER)
    try:
        return bool(storage.read_json(marker).get("far_export"))
    except (FileNotFoundError, IsADirectoryError, ValueError, AttributeError):
        return False


def write_marker(directory: str, facts: dict[str, Any]) -> None:
    """MARKER in a local export directory: what was exported (checkpoint URI, step, kind)."""
    with open(os.path.join(directory, MARKER), "w") as f:
        json.dump({"far_export": 1, **facts}, f, indent=2, sort_keys=True)
        f.write("\n")


@contextlib.contextmanager
def staging(out_uri: str) -> Iterator[str]:
    """A local path, not yet there, to build the export at, with its folder removed on the
    way out (published or not): beside a local target, so `publish` renames it; in the temp
    directory otherwise."""
    if storage.protocol(out_uri) != "file":
        with tempfile.TemporaryDirectory() as scratch:
            yield os.path.join(scratch, "export")
        return
    target = os.path.abspath(storage.normalize(out_uri))
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    remove_stale(parent)
    folder = os.path.join(parent, f".{name}{_STAGING}{os.getpid()}-{uuid.uuid4().hex[:12]}")
    os.mkdir(folder)
    try:
        with _stop_on_sigterm():
            yield os.path.join(folder, "export")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM raises SystemExit (status 143) while an export is staged, so the staging folder
    is removed on the way out; only the main thread can take signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def remove_stale(parent: str) -> list[str]:
    """Remove the staging folders in `parent` whose export process is gone; their names."""
    removed = []
    for entry in os.listdir(parent):
        pid = _staging_pid(entry)
        if pid is not None and not _alive(pid):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
            removed.append(entry)
    return removed


def _staging_pid(entry: str) -> int | None:
    if not entry.startswith(".") or _STAGING not in entry:
        return None
    pid = entry.rsplit(_STAGING, 1)[1].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def publish(staged: str, out_uri: str) -> None:
    """Put the finished export `staged` at `out_uri`, replacing a previous export whole."""
    check(out_uri)  # again: the target may have changed while the model was exported
    if storage.protocol(out_uri) == "file":
        _swap(staged, os.path.abspath(storage.normalize(out_uri)))
        return
    previous = set(storage.list_files(out_uri))
    new = set(storage.list_files(staged))
    for rel in sorted(new - {MARKER}):
        with open(os.path.join(staged, rel), "rb") as f:
            storage.write_bytes(storage.join(out_uri, rel), f.read())
    for rel in sorted(previous - new):
        storage.delete(storage.join(out_uri, rel))
    with open(os.path.join(staged, MARKER), "rb") as f:
        storage.write_bytes(storage.join(out_uri, MARKER), f.read())


def _swap(staged: str, target: str) -> None:
    """Rename `staged` to `target`; a previous export there is moved aside first, back if the
    rename fails, and removed after."""
    if not os.path.exists(target):
        os.rename(staged, target)
        return
    aside = os.path.join(os.path.dirname(staged), "previous")
    os.rename(target, aside)
    try:
        os.rename(staged, target)
    except BaseException:
        os.rename(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)
