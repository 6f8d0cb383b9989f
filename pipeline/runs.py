"""The runs under one storage root, for `far runs`: which exist, how each last ended, its root.

A team sharing a Prefect server (or a bucket) needs to see every run under a root without
knowing their names. Everything here is read as plain data from each run's run.json,
lease.json and ledger: nothing a run names is imported, and nothing is verified (that is
`far audit`'s work, which the listing's ledger root lets a reader start).
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import ValidationError

from pipeline import lease
from pipeline.manifest import MANIFEST_NAME, manifest_uri
from schemas.cli_output import RunListing, RunState
from schemas.record import LeaseHolder, RunManifest
from stages.core import ledger, storage


def list_runs(root: str) -> list[RunListing]:
    """Every directory directly under `root` that holds a run.json, by name.

    Raises FileNotFoundError when `root` does not exist.
    """
    if not storage.exists(root):
        raise FileNotFoundError(f"no storage root at {root}: give the --root `far run` used")
    names = sorted(
        name
        for name in storage.list_dirs(root)
        if storage.exists(storage.join(root, name, MANIFEST_NAME))
    )
    return [describe_run(storage.join(root, name), name) for name in names]


def describe_run(run_uri: str, name: str) -> RunListing:
    """One run's listing; a run.json that cannot be read is listed as unreadable, with why."""
    try:
        manifest = RunManifest.model_validate_json(storage.read_bytes(manifest_uri(run_uri)))
    except (OSError, ValueError) as e:  # ValidationError is a ValueError
        reason = " ".join(str(e).split())[:200]
        return RunListing(
            run=name,
            run_uri=run_uri,
            state="unreadable",
            detail=f"{MANIFEST_NAME}: {reason}",
            sessions=0,
            last_session_at=None,
            recipe_source=None,
            ledger_root=_ledger_root(run_uri),
        )
    last = manifest.invocations[-1] if manifest.invocations else None
    outcome = last.outcome if last else None
    return RunListing(
        run=manifest.run,
        run_uri=run_uri,
        state=_state(outcome, run_uri),
        detail=outcome or "no outcome recorded",
        sessions=len(manifest.invocations),
        last_session_at=last.started_at.isoformat() if last else None,
        recipe_source=manifest.recipe_source or None,
        ledger_root=_ledger_root(run_uri),
    )


def _state(outcome: str | None, run_uri: str) -> RunState:
    """complete | stopped | failed from the recorded outcome; with none, running while a
    fresh lease is held, else crashed (the holder went away without noting how it ended)."""
    if outcome is not None:
        if outcome.startswith("complete"):
            return "complete"
        return "stopped" if outcome.startswith("stopped") else "failed"
    return "running" if _lease_is_fresh(run_uri) else "crashed"


def _lease_is_fresh(run_uri: str) -> bool:
    try:
        holder = LeaseHolder.model_validate_json(storage.read_bytes(lease.lease_uri(run_uri)))
    except (OSError, ValidationError):
        return False
    return holder.expires_at > datetime.now(UTC)


def _ledger_root(run_uri: str) -> str | None:
    """The last readable ledger entry's root (a damaged line is the audit's to report)."""
    entries, _ = ledger.scan(run_uri)
    return entries[-1].root if entries else None
