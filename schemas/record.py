"""The stage record: written LAST into a stage's directory, it is the stage's commit marker.

A directory without a record is unfinished work (or a crash); a directory with one is a
finished stage whose output can be reused without recomputation.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from schemas.artifacts import StageOutput
from schemas.base import Frozen
from schemas.recipe import StageKind


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


class SessionLog(Frozen):
    """One session's work on a stage (a stage that stopped at a deadline has several)."""

    flow_run_id: str | None
    started_at: datetime
    finished_at: datetime
    seconds: float
    outcome: Literal["stopped", "failed", "complete"]
    detail: str = ""


class FileDigest(Frozen):
    size: int
    sha256: str


class StageRecord(Frozen):
    stage: StageKind
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
    history: dict[str, list[float]] = Field(default_factory=dict)  # per-step curves
    flow_run_id: str | None = None
    # scores of this stage's checkpoint, added by evaluation stages that used it
    evaluations: list[dict[str, Any]] = Field(default_factory=list)
    input_artifacts: dict[str, ArtifactRef] = Field(default_factory=dict)
    sessions: list[SessionLog] = Field(default_factory=list)  # oldest first, this one last
    files: dict[str, FileDigest] = Field(default_factory=dict)  # the stage directory's content
    node: str | None = None  # the pipeline node id, when it is not the stage kind


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


class Invocation(Frozen):
    """One `far run` / `far resume` / deployment run of a run: when, from where, what it allowed."""

    started_at: datetime
    flow_run_id: str | None
    host: str
    allowed_changes: list[str] = Field(default_factory=list)
    changes: list[str] = Field(default_factory=list)  # "path: old -> new" accepted this time
    stages: dict[str, str] = Field(default_factory=dict)  # stage -> ran | skipped, at the end
    outcome: str | None = None  # complete | stopped: <reason>; None while running or crashed


class RunManifest(Frozen):
    """{root}/{run}/run.json: the recipe a run follows, and every session that worked on it.

    Not a commit marker (stage records are): it is rewritten at the start of each session.
    """

    run: str
    recipe: dict[str, Any]  # the validated recipe, as JSON
    recipe_source: str
    created_at: datetime
    invocations: list[Invocation] = Field(default_factory=list)
