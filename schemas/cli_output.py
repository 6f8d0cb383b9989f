"""What `far status|runs|lineage|audit|validate --json` print: one JSON object per command.

Scripts and dashboards read these instead of parsing the text tables, so they are contracts
like the others: frozen, unknown fields refused, every field documented (the generated page
docs/reference/json.md lists them). `schema_version` moves only when a field is removed or
changes meaning; a new field keeps it. On exit 2 (an input error) nothing is printed on
stdout: the one `far:` line on stderr says what to fix.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas.base import Frozen

SCHEMA_VERSION: Literal[1] = 1
RunState = Literal["complete", "stopped", "failed", "running", "crashed", "unreadable"]


class StageStatus(Frozen):
    """One stage directory of a run and where it stands (a node can have several: superseded
    or unverified ones besides its current one)."""

    stage: str
    """The pipeline node id (the kind, in the default pipeline)."""
    state: Literal["complete", "partial", "not started", "superseded", "unverified"]
    """complete: its record is committed; partial: started, not committed (a later session
    continues it); superseded: an earlier directory of the node, replaced after an allowed
    change; unverified: a record the ledger does not vouch for, never the current stage."""
    directory: str | None
    """The stage directory `{run}/{node}-{hash}`; null when not started."""
    step: int | None
    """The latest committed checkpoint step (training stages); null otherwise."""
    max_steps: int | None
    """The training stage's max_steps; null for other kinds."""
    batches: int | None = None
    """partial evaluations only: the batches of completions kept on storage so far (a later
    session skips them); null otherwise."""
    sessions: int
    """Sessions that worked on this directory."""
    seconds: float | None
    """Wall seconds the stage took, once complete."""
    output_uri: str | None
    """The output URI as `far run` prints it, once complete."""
    doubt: str | None
    """unverified only: why the record is not taken as the run's own commit."""


class StatusOutput(Frozen):
    """`far status RUN --json`."""

    schema_version: Literal[1] = SCHEMA_VERSION
    """This schema's version."""
    command: Literal["status"] = "status"
    """The command that printed it."""
    run: str
    """The run's name."""
    run_uri: str
    """`{storage_root}/{name}`."""
    sessions: int
    """Sessions run.json records (each `far run`, `far resume` or scheduled run)."""
    last_outcome: str | None
    """How the last session ended (complete, stopped: REASON, failed: REASON); null while it
    runs or when it crashed, or before any session."""
    stages: list[StageStatus]
    """Every node of the run's DAG, in the order it runs."""
    coverage: str
    """What the ledger check behind `unverified` can and cannot detect."""
    plugins_checked: list[str] = Field(default_factory=list)
    """One line per --plugin MODULE whose file matched a digest the run recorded for it."""
    plugins_unchecked: list[str] = Field(default_factory=list)
    """One line per plugin module or stage kind the run names that was neither loaded nor
    checked (nothing a run names is imported; its records are checked as data)."""


class RunListing(Frozen):
    """One run under a storage root, as `far runs` reads it from its run.json, lease and
    ledger (plain data: nothing a run names is imported or run)."""

    run: str
    """The run's name (its directory under the root)."""
    run_uri: str
    """`{storage_root}/{name}`."""
    state: RunState
    """How its last session ended: complete, stopped (session budget, SIGTERM; `far run`
    continues it), failed (see `detail`); running (its lease is held and fresh) or crashed
    (no outcome and no live lease); unreadable (run.json could not be read: `detail`)."""
    detail: str
    """The last session's outcome as recorded, or why the run could not be read."""
    sessions: int
    """Sessions run.json records."""
    last_session_at: str | None
    """When the last session started (ISO 8601, UTC); null before any."""
    recipe_source: str | None
    """The recipe file the run was started from."""
    ledger_root: str | None
    """The run's latest ledger root (what `far audit --expect-root` checks); null before its
    first commit."""


class RunsOutput(Frozen):
    """`far runs ROOT --json`."""

    schema_version: Literal[1] = SCHEMA_VERSION
    """This schema's version."""
    command: Literal["runs"] = "runs"
    """The command that printed it."""
    root: str
    """The storage root listed."""
    runs: list[RunListing]
    """Every directory under the root with a run.json, by name."""


class Code(Frozen):
    """The code that produced a record."""

    far_version: str
    """The far package's version."""
    git_commit: str | None
    """The checkout's commit; null when unknown."""
    stage_version: int
    """The stage kind's version (hashed into the stage directory)."""
    packages: dict[str, str]
    """Versions of the libraries that matter (google-tunix, jax, ...)."""


class Machine(Frozen):
    """Where a record was produced."""

    platform: str
    """JAX platform: cpu, tpu, gpu."""
    device_kind: str
    """The device model."""
    device_count: int
    """Devices of all processes."""
    process_count: int
    """JAX processes (hosts)."""


class EvaluationScores(Frozen):
    """One evaluation of a checkpoint (its write-once evaluation file)."""

    uri: str
    """The evaluation file."""
    scores: dict[str, Any]
    """The scores that evaluation wrote (format_rate, accuracy, ...)."""


class LineageEntry(Frozen):
    """One stage record in an artifact's ancestry, with the records of its inputs."""

    name: str
    """How the downstream stage calls this input (dataset, sft, ...); `artifact` at the top."""
    node: str
    """The pipeline node id."""
    kind: str
    """The stage kind."""
    record_uri: str
    """The record (stage.json)."""
    stage_hash: str
    """The stage hash (its directory's suffix is the first 12 hex digits)."""
    output_uri: str
    """The output URI as `far run` prints it."""
    sessions: list[str]
    """Each session's outcome on this stage, oldest first."""
    seconds: float
    """Wall seconds over all sessions."""
    flow_run_ids: list[str]
    """The Prefect flow runs of those sessions."""
    skipped_sessions: int
    """Later sessions of the run that reused (skipped) it."""
    code: Code
    """The code that produced it."""
    hardware: Machine
    """Where it was produced."""
    metrics: dict[str, float]
    """The record's metrics."""
    evaluations: list[EvaluationScores]
    """Evaluations of this checkpoint, oldest first."""
    sources: dict[str, str]
    """External inputs (data files, packages): URI -> fingerprint."""
    parents: list[LineageEntry]
    """The records of its inputs (a record reached twice appears twice)."""


class LineageOutput(Frozen):
    """`far lineage URI --json`."""

    schema_version: Literal[1] = SCHEMA_VERSION
    """This schema's version."""
    command: Literal["lineage"] = "lineage"
    """The command that printed it."""
    uri: str
    """The URI asked about."""
    run_uri: str
    """The run the record belongs to."""
    artifact: LineageEntry
    """The record that produced `uri`, and its ancestry."""
    openlineage_file: str | None
    """Where --openlineage wrote the run's events; null without it."""


class AuditOutput(Frozen):
    """`far audit RUN --json` (exit 1 when `problems` is not empty)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    """This schema's version."""
    command: Literal["audit"] = "audit"
    """The command that printed it."""
    run_uri: str
    """The run audited."""
    records: int
    """Stage records checked."""
    files: int
    """Files those records list, re-hashed."""
    ok: bool
    """True when everything matches (no problem)."""
    problems: list[str]
    """One line per file missing or altered, record unsealed, ledger entry broken, ..."""
    accepted_later: list[str]
    """With --accept-later: the ledger entries after --expect-root it accepted."""
    coverage: str
    """What this audit can and cannot detect (with or without --expect-root, FAR_AUDIT_KEY)."""
    plugins_checked: list[str] = Field(default_factory=list)
    """One line per --plugin MODULE whose file matched a digest the run recorded for it."""
    plugins_unchecked: list[str] = Field(default_factory=list)
    """One line per plugin module or stage kind the run names that was neither loaded nor
    checked (nothing a run names is imported; its records are checked as data)."""


class PlannedNode(Frozen):
    """What `far run` would do with one node of the DAG."""

    node: str
    """The node id."""
    kind: str
    """Its stage kind."""
    action: Literal["run", "continue", "skip", "refused", "depends", "-"]
    """run, continue (a partial stage), skip (complete), refused (drift guard), depends (on an
    upstream node that runs first), - (not reached after a refused node)."""
    stage_hash: str | None
    """Its directory's hash (12 hex digits); null when not known yet."""
    detail: str
    """Why."""
    models: list[str] | None = None
    """An evaluate node: the models it scores, in order; null for other kinds."""


class ValidateOutput(Frozen):
    """`far validate RECIPE --json` (exit 2, with `refused`, when the drift guard refuses)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    """This schema's version."""
    command: Literal["validate"] = "validate"
    """The command that printed it."""
    recipe: str
    """The recipe as given."""
    run: str
    """The run's name (after --name and overrides)."""
    run_uri: str
    """`{storage_root}/{name}`."""
    valid: bool
    """True when a run would start (nothing refused)."""
    refused: str | None
    """The drift guard's refusal (the changes and the --allow-change flags to accept them)."""
    nodes: list[PlannedNode]
    """Every node, in the order it would run."""
    warnings: list[str] = Field(default_factory=list)
    """What the recipe asks for that the run would not do (each also on stderr)."""
