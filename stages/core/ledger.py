"""The run's ledger ({root}/{run}/ledger.jsonl): one hash chain over every commit of a run.

A stage record's seal is a plain digest: whoever can rewrite a record can recompute it, and
nothing downstream pins the last stage's record or run.json. So every record commit and every
write of run.json appends an entry here: the file's path (relative to the run), the sha256 of
its bytes, and a chain root, sha256 over the previous root and this entry. The latest root
pins everything committed so far.

The root is worth something only outside run storage: `far run` prints it and publishes it as
a Prefect artifact (and in the OpenLineage events), so `far audit --expect-root` compares the
chain with a root the writer could not change. Where a signing key is configured
(FAR_AUDIT_KEY, read by the CLI), each entry also carries HMAC-SHA256(key, root): a writer
without the key cannot re-sign a rewritten chain. A writer who can rewrite all of storage
and holds the key (or whose root nobody kept) cannot be detected; `far audit` says so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Literal

from pydantic import SecretStr

from schemas.record import LedgerEntry
from stages.core import storage

LEDGER_NAME = "ledger.jsonl"
Kind = Literal["record", "manifest"]


def ledger_uri(run_uri: str) -> str:
    return storage.join(run_uri, LEDGER_NAME)


def chain_root(prev: str | None, kind: str, path: str, sha256: str) -> str:
    """The root after an entry: sha256 over the previous root and the entry's content."""
    payload = json.dumps([prev, kind, path, sha256], separators=(",", ":"))
    return storage.sha256_bytes(payload.encode())


def sign(key: SecretStr, root: str) -> str:
    secret = key.get_secret_value().encode()
    return "hmac-sha256:" + hmac.new(secret, root.encode(), hashlib.sha256).hexdigest()


def read(run_uri: str) -> list[LedgerEntry]:
    """The ledger's entries, oldest first (empty when the run has none)."""
    uri = ledger_uri(run_uri)
    if not storage.exists(uri):
        return []
    lines = storage.read_text(uri).splitlines()
    return [LedgerEntry.model_validate_json(line) for line in lines if line.strip()]


def root(run_uri: str) -> str | None:
    """The run's latest ledger root (None before its first commit)."""
    entries = read(run_uri)
    return entries[-1].root if entries else None


def append(run_uri: str, uri: str, kind: Kind, key: SecretStr | None = None) -> LedgerEntry:
    """Chain the file at `uri` (just written, inside the run) into the run's ledger."""
    path = relative(run_uri, uri)
    sha256 = storage.sha256_bytes(storage.read_bytes(uri))
    entries = read(run_uri)
    prev = entries[-1].root if entries else None
    new_root = chain_root(prev, kind, path, sha256)
    entry = LedgerEntry(
        seq=len(entries),
        kind=kind,
        path=path,
        sha256=sha256,
        prev=prev,
        root=new_root,
        mac=None if key is None else sign(key, new_root),
    )
    lines = [e.model_dump_json() for e in [*entries, entry]]
    storage.write_text(ledger_uri(run_uri), "\n".join(lines) + "\n")
    return entry


def relative(run_uri: str, uri: str) -> str:
    """`uri` relative to the run's root; refuses a file outside the run."""
    base = storage.normalize(run_uri).rstrip("/") + "/"
    full = storage.normalize(uri)
    if not full.startswith(base):
        raise ValueError(f"{uri} is not inside the run {run_uri}: the ledger covers the run only")
    return full[len(base) :]


def verify(
    run_uri: str,
    entries: list[LedgerEntry],
    key: SecretStr | None = None,
    expect_root: str | None = None,
) -> list[str]:
    """Problems with the chain itself: broken links, bad signatures, a missing pinned root."""
    problems = []
    prev: str | None = None
    for e in entries:
        if e.prev != prev or e.root != chain_root(prev, e.kind, e.path, e.sha256):
            problems.append(f"ledger entry {e.seq} ({e.path}): chain broken (ledger edited)")
        if key is not None and (e.mac is None or not hmac.compare_digest(e.mac, sign(key, e.root))):
            state = "unsigned" if e.mac is None else "signature does not match the key"
            problems.append(f"ledger entry {e.seq} ({e.path}): {state} (rewritten without the key)")
        prev = e.root
    if expect_root is not None and all(e.root != expect_root for e in entries):
        problems.append(
            f"{ledger_uri(run_uri)}: the expected root {expect_root} is not in the ledger "
            f"(the chain was rewritten since that root was published)"
        )
    return problems


def check_files(run_uri: str, entries: list[LedgerEntry], present: set[str]) -> list[str]:
    """Each file's latest entry against the file now; `present` are the run's record paths.

    A record is committed once, so a second entry for one is a re-seal; run.json is rewritten
    each session, so only its latest entry counts.
    """
    problems = []
    latest: dict[str, LedgerEntry] = {}
    for e in entries:
        if e.kind == "record" and e.path in latest:
            problems.append(f"{e.path}: committed again in ledger entry {e.seq} (re-sealed)")
        latest[e.path] = e
    if not any(e.kind == "manifest" for e in entries):
        problems.append(f"{storage.join(run_uri, 'run.json')}: not in the ledger")
    for path, e in sorted(latest.items()):
        uri = storage.join(run_uri, path)
        if not storage.exists(uri):
            what = "stage record" if e.kind == "record" else "run manifest"
            problems.append(f"{uri}: {what} in the ledger (entry {e.seq}) is missing (removed)")
        elif storage.sha256_bytes(storage.read_bytes(uri)) != e.sha256:
            problems.append(f"{uri}: differs from its ledger entry {e.seq} (rewritten)")
    for path in sorted(present - set(latest)):
        problems.append(f"{storage.join(run_uri, path)}: stage record not in the ledger (planted)")
    return problems
