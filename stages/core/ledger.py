"""The run's ledger ({root}/{run}/ledger.jsonl): one hash chain over every commit of a run.

A stage record's seal is a plain digest: whoever can rewrite a record can recompute it, and
nothing downstream pins the last stage's record or run.json. So every record commit and every
write of run.json appends an entry here: the file's path (relative to the run), the sha256 of
its bytes, and a chain root, sha256 over the previous root and this entry. The latest root
pins everything committed so far.

The root is worth something only outside run storage: `far run` prints it and publishes it as
a Prefect artifact (and in the OpenLineage events), so `far audit --expect-root` compares the
chain with a root the writer could not change. That root must be the chain's last: an entry
appended after it (a forged record sealed and appended) is no more trusted than storage, so
the audit names each one unless told to accept later sessions (`--accept-later`), and
`far status` does not take such a record as a node's current stage (`trusted_prefix`).
Where a signing key is configured (FAR_AUDIT_KEY, read by the CLI), each entry also carries
HMAC-SHA256(key, root): a writer without the key cannot re-sign a rewritten chain. A writer
who can rewrite all of storage and holds the key (or whose root nobody kept) cannot be
detected; `far audit` says so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import Literal

from pydantic import SecretStr, ValidationError

from schemas.record import LedgerEntry
from stages.core import storage
from stages.core.errors import InputError, TamperedStage

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
    """The ledger's entries, oldest first (empty when the run has none); a writer appends to
    it, so a line that is no entry (torn or edited) is refused, naming the line."""
    entries, problems = scan(run_uri)
    if problems:
        raise TamperedStage(f"{problems[0]}; audit the run with `far audit`")
    return entries


def scan(run_uri: str) -> tuple[list[LedgerEntry], list[str]]:
    """The ledger's readable entries, oldest first, and a problem line for each line that is
    not an entry (a torn write, garbage, a path leaving the run): the audit goes on past them."""
    uri = ledger_uri(run_uri)
    if not storage.exists(uri):
        return [], []
    entries, problems = [], []
    text = storage.read_bytes(uri).decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entries.append(LedgerEntry.model_validate_json(line))
        except ValidationError as e:
            problems.append(f"{uri}: line {number} is not a ledger entry ({_first_error(e)})")
    return entries, problems


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


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


ROOT_FORMAT = re.compile(r"^sha256:[0-9a-f]{64}$")


class BadRoot(InputError):
    """A published root given on the command line that is no root at all."""


def check_root(value: str) -> str:
    """`value` as a root (`far audit --expect-root`): sha256:<64 lowercase hex digits>."""
    if not ROOT_FORMAT.match(value):
        raise BadRoot(
            f"--expect-root: expected a ledger root as `far run` printed it "
            f"(sha256: and 64 hex digits), got {value!r}"
        )
    return value


def verify(
    run_uri: str,
    entries: list[LedgerEntry],
    key: SecretStr | None = None,
    expect_root: str | None = None,
    accept_later: bool = False,
) -> list[str]:
    """Problems with the chain itself: broken links, bad signatures, a missing pinned root,
    and (unless `accept_later`) every entry appended after the pinned root."""
    problems = []
    prev: str | None = None
    for e in entries:
        if e.prev != prev or e.root != chain_root(prev, e.kind, e.path, e.sha256):
            problems.append(f"ledger entry {e.seq} ({e.path}): chain broken (ledger edited)")
        if key is not None and (e.mac is None or not hmac.compare_digest(e.mac, sign(key, e.root))):
            state = "unsigned" if e.mac is None else "signature does not match the key"
            problems.append(f"ledger entry {e.seq} ({e.path}): {state} (rewritten without the key)")
        prev = e.root
    if expect_root is None:
        return problems
    later = after_root(entries, expect_root)
    if later is None:
        problems.append(
            f"{ledger_uri(run_uri)}: the expected root {expect_root} is not in the ledger "
            f"(the chain was rewritten since that root was published)"
        )
    elif not accept_later:
        problems += [
            f"ledger entry {e.seq} ({e.path}): appended after the expected root, so the root "
            f"does not cover it (audit with the root published after it, or --accept-later)"
            for e in later
        ]
    return problems


def after_root(entries: list[LedgerEntry], expect_root: str) -> list[LedgerEntry] | None:
    """The entries after the one whose root is `expect_root`; None when none has it."""
    for i, e in enumerate(entries):
        if e.root == expect_root:
            return entries[i + 1 :]
    return None


def trusted_prefix(
    entries: list[LedgerEntry],
    key: SecretStr | None = None,
    expect_root: str | None = None,
    accept_later: bool = False,
) -> tuple[int, str]:
    """How many leading entries the run's own writer is known to have chained, and why the
    rest are not: the chain must be unbroken up to an entry, signed (with a key), and at or
    before the expected root (after it only with `accept_later`). Without a root or a key
    this is only the ledger agreeing with itself."""
    prev: str | None = None
    later = None if expect_root is None else after_root(entries, expect_root)
    if expect_root is not None and later is None:
        return 0, f"the expected root {expect_root} is not in the ledger"
    pinned = len(entries) - len(later) if later is not None and not accept_later else None
    for i, e in enumerate(entries):
        if pinned is not None and i >= pinned:
            return i, f"committed after the expected root (ledger entry {e.seq})"
        if e.prev != prev or e.root != chain_root(prev, e.kind, e.path, e.sha256):
            return i, f"the ledger's chain is broken at entry {e.seq}"
        if key is not None and (e.mac is None or not hmac.compare_digest(e.mac, sign(key, e.root))):
            return i, f"ledger entry {e.seq} is not signed with the key"
        prev = e.root
    return len(entries), ""


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
        elif _sha256_or_none(uri) != e.sha256:
            problems.append(f"{uri}: differs from its ledger entry {e.seq} (rewritten)")
    for path in sorted(present - set(latest)):
        problems.append(f"{storage.join(run_uri, path)}: stage record not in the ledger (planted)")
    return problems


def _sha256_or_none(uri: str) -> str | None:
    """A file's sha256; None when it is no file (an entry naming a directory)."""
    try:
        return storage.sha256_bytes(storage.read_bytes(uri))
    except (IsADirectoryError, PermissionError):
        return None
