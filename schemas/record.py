"""The stage record: written LAST into a stage's directory, it is the stage's commit marker.

A directory without a record is unfinished work (or a crash); a directory with one is a
finished stage whose output can be reused without recomputation.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from schemas.artifacts import StageOutput
from schemas.base import Frozen


class CodeVersion(Frozen):
    """Which code produced the output. Recorded for audit; only `stage_version` is hashed."""

    far_version: str
    stage_version: int
    git_commit: str | None
    packages: dict[str, str]


class Hardware(Frozen):
    platform: str
    device_kind: str
    device_count: int
    process_count: int


class ArtifactRef(Frozen):
    """An input a stage consumed: where it was, its content fingerprint, and its record."""

    uri: str
    fingerprint: str
    record_uri: str | None = None  # None for external sources (data files, packages)
    record_digest: str | None = None  # sha256 of that record's bytes as this stage read it


class SessionLog(Frozen):
    """One session's work on a stage (a stage that stopped at a deadline has several)."""

    flow_run_id: str | None
    started_at: datetime
    finished_at: datetime
    seconds: float
    outcome: Literal["stopped", "failed", "complete"]
    detail: str = ""


class FileDigest(Frozen):
    """A committed file: its size and content digest ("sha256:<hex>", or the object store's
    own checksum "md5:<base64>" / "crc32c:<base64>" for objects it keeps one for)."""

    size: int
    digest: str

    @model_validator(mode="before")
    @classmethod
    def _from_sha256_field(cls, data: Any) -> Any:
        """Records committed before digests named their algorithm stored a bare sha256."""
        if isinstance(data, dict) and "sha256" in data and "digest" not in data:
            return {"size": data.get("size"), "digest": f"sha256:{data['sha256']}"}
        return data


class StageRecord(Frozen):
    stage: str
    """The stage's kind, as registered in stages/registry.py (e.g. sft, evaluate)."""
    run: str
    status: Literal["complete"]
    stage_hash: str
    directory: str
    config: dict[str, Any]
    inputs: dict[str, str]
    output: StageOutput
    code: CodeVersion
    hardware: Hardware
    started_at: datetime
    finished_at: datetime
    seconds: float
    metrics: dict[str, float]
    # per-step curves of every session (metrics: history_from_step, 0 unless a session was
    # killed before it could keep its curves)
    history: dict[str, list[float]] = Field(default_factory=dict)
    flow_run_id: str | None = None
    # Only in records committed before evaluations got their own write-once files
    # (<stage dir>/evaluations/); no record is rewritten after its commit any more.
    evaluations: list[dict[str, Any]] = Field(default_factory=list)
    input_artifacts: dict[str, ArtifactRef] = Field(default_factory=dict)
    sessions: list[SessionLog] = Field(default_factory=list)  # oldest first, this one last
    files: dict[str, FileDigest] = Field(default_factory=dict)  # the stage directory's content
    node: str | None = None  # the pipeline node id, when it is not the stage kind
    # sha256 of this record's canonical JSON with `digest` left out: an edit shows in an audit
    digest: str | None = None


class Evaluation(Frozen):
    """Scores of one checkpoint by one evaluation stage: <stage dir>/evaluations/<eval dir>.json.

    Written once, before the evaluation stage commits; the evaluation stage's directory lists
    each such file with its sha256 (evaluations.json), so `far audit` verifies them.
    """

    evaluation: str  # the evaluation stage's directory (its name holds the stage hash)
    checkpoint_uri: str
    report_uri: str
    scores: dict[str, Any]


class ExternalEvaluation(Evaluation):
    """Scores of a checkpoint of another run by one evaluation stage, kept in that stage's own
    directory (<stage dir>/external_evaluations/), never beside the checkpoint: a run writes
    only inside itself. The evaluating stage's record lists the file with its digest; `far
    audit` of the evaluating run checks the checkpoint's record and files against it."""

    checkpoint_record_uri: str
    """The evaluated checkpoint's stage record (stage.json), where it was read."""
    checkpoint_record_digest: str
    """sha256 of that record's bytes as this evaluation read them."""
    checkpoint_fingerprint: str
    """The checkpoint's content fingerprint (its record's output)."""


class StageSummary(Frozen):
    """One stage's line in a run summary: where its output is and whether it ran."""

    stage: str
    output_uri: str
    record_uri: str
    skipped: bool
    seconds: float


class RunSummary(Frozen):
    """What a FAR flow returns: every stage that finished, and whether the run is complete."""

    run: str
    run_uri: str
    complete: bool
    stages: list[StageSummary]
    seconds: float  # wall time inside the flow; minus the stages' seconds = orchestration
    stopped_reason: str | None = None
    ledger_root: str | None = None  # the run's ledger root at the end (stages/core/ledger.py)
    no_progress: bool = False
    """True when the session stopped before any stage committed or took a training step (not
    by a signal): the same budget would stop at the same point; `far` exits 6."""


class Invocation(Frozen):
    """One `far run` / `far resume` / deployment run of a run: when, from where, what it allowed."""

    started_at: datetime
    flow_run_id: str | None
    host: str
    allowed_changes: list[str] = Field(default_factory=list)
    changes: list[str] = Field(default_factory=list)  # "path: old -> new" accepted this time
    overrides: list[str] = Field(default_factory=list)  # `far run` KEY=VALUE, as given
    stages: dict[str, str] = Field(default_factory=dict)  # stage -> ran | skipped, at the end
    outcome: str | None = None  # complete | stopped: <reason>; None while running or crashed
    # the lease this session took over: its holder (host, pid, flow run) stopped renewing it
    # (expired), or its pid was gone on this host; `reason` says which
    took_over: dict[str, Any] | None = None


class LeaseHolder(Frozen):
    """{root}/{run}/lease.json: who writes the run now, until when (renewed by a heartbeat)."""

    token: str  # unique per acquisition: a holder releases only its own lease
    host: str
    pid: int
    flow_run_id: str | None
    acquired_at: datetime
    expires_at: datetime
    # the holder's PID namespace ("pid:[4026531836]"): with the host, says whether its pid can
    # be checked from here (None: not Linux, or a lease from before; then only expiry counts)
    pid_namespace: str | None = None


class RunManifest(Frozen):
    """{root}/{run}/run.json: the recipe a run follows, and every session that worked on it.

    Not a commit marker (stage records are): it is rewritten at the start of each session.
    """

    run: str
    recipe: dict[str, Any]  # the validated recipe, as JSON
    recipe_source: str
    created_at: datetime
    invocations: list[Invocation] = Field(default_factory=list)
    plugins: list[str] = Field(default_factory=list)
    """The modules that registered the stage kinds the recipe names beyond FAR's own (its
    sessions' --plugin): `far status`, `audit`, `lineage` and `resume` import them first."""


class LedgerEntry(Frozen):
    """One line of {root}/{run}/ledger.jsonl: a commit of a stage record or of run.json, chained.

    `root` is sha256 over [prev, kind, path, sha256]; `mac` is HMAC-SHA256(key, root) when the
    run was written with a signing key.
    """

    seq: int
    kind: Literal["record", "manifest"]
    path: str  # relative to the run's root
    sha256: str  # "sha256:<hex>" of the file's bytes as committed
    prev: str | None
    root: str
    mac: str | None = None

    @field_validator("path")
    @classmethod
    def _inside_the_run(cls, path: str) -> str:
        """The ledger covers the run only: a path that could name a file outside it (absolute,
        a URI, or with `..`, `.` or empty segments) is no ledger entry."""
        parts = path.split("/")
        if path.startswith("/") or "://" in path or any(p in ("", ".", "..") for p in parts):
            raise ValueError(
                f"path must be relative to the run, inside it (e.g. sft-0123456789ab/stage.json), "
                f"got {path!r}"
            )
        return path
