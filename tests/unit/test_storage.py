"""Storage behaves alike on a local path, file:// and memory:// (gs:// is in integration)."""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from stages.core import storage


@pytest.fixture(params=["local", "file", "memory"])
def root(request: pytest.FixtureRequest, tmp_path) -> str:
    kind = request.param
    if kind == "local":
        return str(tmp_path)
    if kind == "file":
        return f"file://{tmp_path}"
    return f"memory://far-test-{uuid.uuid4().hex[:8]}"


def test_roundtrip_and_listing(root: str) -> None:
    storage.write_json(storage.join(root, "a/stage.json"), {"status": "complete", "n": 1})
    storage.write_bytes(storage.join(root, "a/b/c.bin"), b"\x00\x01")
    assert storage.read_json(storage.join(root, "a/stage.json")) == {"status": "complete", "n": 1}
    assert storage.read_bytes(storage.join(root, "a/b/c.bin")) == b"\x00\x01"
    assert set(storage.list_files(storage.join(root, "a"))) == {"stage.json", "b/c.bin"}
    assert storage.exists(storage.join(root, "a/b/c.bin"))
    assert not storage.exists(storage.join(root, "a/missing"))


def test_missing_file_error_names_the_uri(root: str) -> None:
    uri = storage.join(root, "nope.json")
    with pytest.raises(FileNotFoundError, match=r"nope\.json"):
        storage.read_json(uri)


def test_overwrite_replaces_content(root: str) -> None:
    uri = storage.join(root, "x.txt")
    storage.write_text(uri, "old")
    storage.write_text(uri, "new")
    assert storage.read_text(uri) == "new"
    assert list(storage.list_files(root)) == ["x.txt"]  # no temp files left behind


def test_tree_fingerprint_sees_changes(root: str) -> None:
    storage.write_bytes(storage.join(root, "t/a"), b"12")
    before = storage.tree_fingerprint(storage.join(root, "t"))
    assert before == storage.tree_fingerprint(storage.join(root, "t"))
    storage.write_bytes(storage.join(root, "t/a"), b"123")
    assert storage.tree_fingerprint(storage.join(root, "t")) != before


def test_tree_fingerprint_sees_bytes_that_keep_the_size(root: str) -> None:
    storage.write_bytes(storage.join(root, "t/w"), b"weights-A")
    before = storage.tree_fingerprint(storage.join(root, "t"))
    storage.write_bytes(storage.join(root, "t/w"), b"weights-B")  # same size, other bytes
    assert storage.list_files(storage.join(root, "t")) == {"w": 9}
    assert storage.tree_fingerprint(storage.join(root, "t")) != before


def test_create_exclusive_and_conditional_replace(root: str) -> None:
    uri = storage.join(root, "run/lease.json")
    assert storage.create_exclusive(uri, b"first")
    assert not storage.create_exclusive(uri, b"second")
    assert storage.read_bytes(uri) == b"first"
    data, version = storage.read_versioned(uri) or (b"", "")
    assert data == b"first"
    assert storage.replace_if_version(uri, b"renewed", version)
    assert not storage.replace_if_version(uri, b"stale writer", version)  # version moved on
    assert storage.read_bytes(uri) == b"renewed"
    _, version = storage.read_versioned(uri) or (b"", "")
    assert not storage.replace_if_version(uri, None, "not-the-version")
    assert storage.replace_if_version(uri, None, version)
    assert storage.read_versioned(uri) is None
    assert storage.create_exclusive(uri, b"again")


def test_publish_and_fetch_tree_through_memory(tmp_path) -> None:
    uri = f"memory://far-ckpt-{uuid.uuid4().hex[:8]}/checkpoints"
    local = storage.orbax_directory(uri)
    assert local != uri and not local.startswith("memory://")
    os.makedirs(os.path.join(local, "3/model_params"), exist_ok=True)
    with open(os.path.join(local, "3/model_params/data"), "wb") as f:
        f.write(b"weights")
    storage.publish_tree(local, uri)
    assert storage.read_bytes(storage.join(uri, "3/model_params/data")) == b"weights"
    shutil.rmtree(local)
    fetched = storage.fetch_tree(uri)
    with open(os.path.join(fetched, "3/model_params/data"), "rb") as f:
        assert f.read() == b"weights"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("runs/x", os.path.abspath("runs/x")),
        ("file:///tmp/r", "/tmp/r"),
        ("gs://b/p/", "gs://b/p"),
        ("memory://m", "memory://m"),
    ],
)
def test_normalize(uri: str, expected: str) -> None:
    assert storage.normalize(uri) == expected


def test_orbax_writes_natively_to_local_and_gs() -> None:
    assert storage.orbax_directory("/tmp/x") == "/tmp/x"
    assert storage.orbax_directory("gs://b/x") == "gs://b/x"


def test_digests_directories_copies_and_content_fingerprints(root: str) -> None:
    import hashlib

    storage.write_bytes(storage.join(root, "s/stage.json"), b"{}")
    storage.write_bytes(storage.join(root, "s/ck/5/w"), b"abc")
    storage.write_bytes(storage.join(root, "s/top.txt"), b"")
    digests = storage.file_digests(storage.join(root, "s"), skip=("stage.json",))
    assert digests == {
        "ck/5/w": (3, f"sha256:{hashlib.sha256(b'abc').hexdigest()}"),
        "top.txt": (0, f"sha256:{hashlib.sha256(b'').hexdigest()}"),
    }
    assert storage.list_dirs(storage.join(root, "s")) == ["ck"]
    assert storage.list_dirs(storage.join(root, "absent")) == []
    storage.copy_tree(storage.join(root, "s/ck"), storage.join(root, "t/ck"))
    assert storage.read_bytes(storage.join(root, "t/ck/5/w")) == b"abc"
    before = storage.content_fingerprint(storage.join(root, "s/ck/5/w"))
    assert before == f"sha256:{hashlib.sha256(b'abc').hexdigest()}"
    storage.write_bytes(storage.join(root, "s/ck/5/w"), b"abd")
    assert storage.content_fingerprint(storage.join(root, "s/ck/5/w")) != before
    with pytest.raises(FileNotFoundError, match="no such file"):
        storage.content_fingerprint(storage.join(root, "s/nope"))
