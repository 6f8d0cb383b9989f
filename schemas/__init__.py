"""FAR's shared vocabulary: recipes, the artifacts stages hand each other, and stage records.

Nothing in this package does I/O or imports JAX: it is safe to import anywhere (CLI, flows,
tests, a notebook) and cheap to validate before any compute starts.
"""

from schemas.artifacts import (
    CheckpointArtifact,
    DataCard,
    DatasetArtifact,
    EvalReport,
    ModelScores,
    StageOutput,
)
from schemas.base import Frozen
from schemas.recipe import (
    Architecture,
    DataPrepConfig,
    EvalConfig,
    GRPOConfig,
    LoraSpec,
    MeshSpec,
    ModelSpec,
    Recipe,
    SFTConfig,
    SourceSpec,
    SplitSpec,
)
from schemas.record import CodeVersion, Hardware, RunSummary, StageRecord, StageSummary

__all__ = [
    "Architecture",
    "CheckpointArtifact",
    "CodeVersion",
    "DataCard",
    "DataPrepConfig",
    "DatasetArtifact",
    "EvalConfig",
    "EvalReport",
    "Frozen",
    "GRPOConfig",
    "Hardware",
    "LoraSpec",
    "MeshSpec",
    "ModelScores",
    "ModelSpec",
    "Recipe",
    "RunSummary",
    "SFTConfig",
    "SourceSpec",
    "SplitSpec",
    "StageOutput",
    "StageRecord",
    "StageSummary",
]
