"""storage.reads_once(): within it each read reaches the filesystem once per URI, and a write
through storage forgets what it may have changed (the file, its parents' listings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stages.core import storage


def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The fsspec methods storage calls from now on, by name."""
    calls: list[str] = []
    split = storage._split

    class Noting:
        def __init__(self, fs: Any) -> None:
            self._fs = fs

        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            return getattr(self._fs, name)

    monkeypatch.setattr(storage, "_split", lambda uri: (Noting(split(uri)[0]), split(uri)[1]))
    return calls


def test_a_read_reaches_storage_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage.write_json(str(tmp_path / "a.json"), {"x": 1})
    calls = counted(monkeypatch)
    with storage.reads_once():
        first = storage.read_json(str(tmp_path / "a.json"))
        first["x"] = 2  # a caller's change to what it read is its own
        assert storage.read_json(f"file://{tmp_path}/a.json") == {"x": 1}
        assert storage.list_dirs(str(tmp_path)) == storage.list_dirs(str(tmp_path)) == []
    assert calls.count("cat_file") == 1 and calls.count("ls") == 1
    storage.read_json(str(tmp_path / "a.json"))  # outside: read again
    assert calls.count("cat_file") == 2


def test_a_write_forgets_what_it_changed(tmp_path: Path) -> None:
    target = str(tmp_path / "d" / "f.json")
    with storage.reads_once():
        assert not storage.exists(target)
        assert storage.list_dirs(str(tmp_path)) == []
        storage.write_json(target, {"v": 1})
        assert storage.exists(target)
        assert storage.list_dirs(str(tmp_path)) == ["d"]
        assert storage.read_json(target) == {"v": 1}
        storage.write_json(target, {"v": 2})
        assert storage.read_json(target) == {"v": 2}
        storage.delete(target)
        assert not storage.exists(target)
