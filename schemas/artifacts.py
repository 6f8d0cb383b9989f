"""What stages hand each other: URIs and metadata, never arrays.

Each artifact carries a fingerprint, the content identity that downstream stage hashes are
built from, and enough metadata for the receiving stage to refuse a mismatch (another model
config, another tokenizer) before it spends any compute.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.base import Frozen
from schemas.recipe import LoraSpec, ModelSpec, PromptFormat

Fingerprint = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class DataCard(Frozen):
    """What went into a dataset, and what was kept out and why."""

    counts_by_source: dict[str, dict[str, int]]  # split -> source -> examples
    counts_by_domain: dict[str, dict[str, int]]  # split -> domain -> examples
    target_mix: dict[str, dict[str, float]]  # split -> domain -> proportion (when given)
    achieved_mix: dict[str, dict[str, float]]  # split -> domain -> proportion
    quarantined_by_reason: dict[str, int]
    sft_length_histogram: dict[str, int]  # token-length bin -> examples
    packed: bool
    sft_rows: int
    useful_token_fraction: float


class DatasetArtifact(Frozen):
    """Prepared, tokenized data: fixed-shape SFT arrays plus prompt sets for GRPO and eval."""

    kind: Literal["dataset"] = "dataset"
    uri: str
    tokenizer: str
    seq_len: int
    prompt_len: int
    split_sizes: dict[str, int]
    quarantined: int
    card: DataCard
    fingerprint: Fingerprint
    # left out of the dump at its default, so records of FAR's own format read as before
    prompt: PromptFormat = Field(
        default_factory=PromptFormat, exclude_if=lambda v: v == PromptFormat()
    )
    """The format its prompts and SFT targets were written in; later stages grade by it."""


class CheckpointArtifact(Frozen):
    """An Orbax checkpoint (the CheckpointManager root) and everything needed to restore it.

    When `lora` is set the checkpoint holds adapters only; the base weights come from `model`.
    """

    kind: Literal["checkpoint"] = "checkpoint"
    uri: str
    step: int
    model: ModelSpec
    tokenizer: str
    lora: LoraSpec | None
    size_bytes: int
    fingerprint: Fingerprint


class ModelScores(Frozen):
    """One evaluated model's metrics over the eval prompts.

    accuracy: per completion, math answers equal numerically or symbolically and code
    passes all its tests. metrics adds exact/symbolic accuracy, pass@1, pass@k, majority
    vote, lengths and sandbox failures; by_domain breaks format rate and accuracy down.
    """

    name: str
    checkpoint_uri: str | None
    num_prompts: int
    format_rate: float
    accuracy: float
    mean_completion_chars: float
    metrics: dict[str, float] = Field(default_factory=dict)
    by_domain: dict[str, dict[str, float]] = Field(default_factory=dict)


VS_PREVIOUS = "vs_previous"
"""The metric prefix of a model's paired comparison with the model before it in the report
(`vs_previous/difference`, `vs_previous/p_value`, ...; `vs_previous/format_...` for format)."""

REWARD_PREFIX = "reward/"
"""The metric prefix of the mean of one of an evaluation's extra rewards (`eval.rewards`):
`reward/<name>`."""

GREEDY_SUFFIX = "@greedy"
"""An evaluated model's greedy row beside its sampled one (EvalConfig.greedy) is labelled
`<model>@greedy`, in the report and in samples.jsonl."""

STEP_SUFFIX = "@step"
"""An earlier saved step of an evaluated checkpoint (EvalConfig.steps: saved) is the model
`<model>@step<N>`; its greedy row beside samples is `<model>@step<N>@greedy`."""


class EvalReport(Frozen):
    """Metrics per model; the per-sample outputs behind them live at `samples_uri`."""

    kind: Literal["eval_report"] = "eval_report"
    uri: str
    samples_uri: str
    scores: list[ModelScores]
    fingerprint: Fingerprint


class PreferenceDataset(Frozen):
    """Preference pairs for DPO / ORPO: pairs.jsonl rows of prompt, chosen, rejected (chat
    formatted), each with where it came from and, when built from samples, both rewards."""

    kind: Literal["preferences"] = "preferences"
    uri: str
    pairs: int
    source: str  # the file it was read from, or the samples it was built from
    fingerprint: Fingerprint


Artifact = DatasetArtifact | CheckpointArtifact | EvalReport | PreferenceDataset
"""What a stage's entry point returns and a downstream stage's input receives."""

StageOutput = Annotated[
    DatasetArtifact | CheckpointArtifact | EvalReport | PreferenceDataset,
    Field(discriminator="kind"),
]
