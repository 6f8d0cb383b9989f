"""Content fingerprints on gs:// come from the objects' own GCS checksums (no download), and
see a change of bytes that keeps every size; against fake-gcs-server's real JSON API."""

from __future__ import annotations

import base64
import hashlib

import pytest

from stages.core import storage

pytestmark = [pytest.mark.gcs]


def test_gcs_digests_are_the_stored_md5_and_see_same_size_changes(fake_gcs: str) -> None:
    tree = f"gs://{fake_gcs}/fingerprints/checkpoints"
    storage.write_bytes(f"{tree}/1/w", b"weights-A")
    storage.write_bytes(f"{tree}/1/meta", b"{}")
    md5 = base64.b64encode(hashlib.md5(b"weights-A").digest()).decode()
    assert storage.file_digests(tree)["1/w"] == (9, f"md5:{md5}")
    before = storage.tree_fingerprint(tree)
    storage.write_bytes(f"{tree}/1/w", b"weights-B")
    assert storage.list_files(tree) == {"1/w": 9, "1/meta": 2}
    assert storage.tree_fingerprint(tree) != before
