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


class StageRecord(Frozen):
    stage: Literal["data_prep", "sft", "grpo", "evaluate"]
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
