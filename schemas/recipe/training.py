"""The supervised and preference training stages' configs: SFT, DPO / ORPO and logit
distillation (GRPO's is in grpo.py).

Part of the recipe schema (schemas/recipe/__init__.py says how the package is laid out).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from schemas.base import Frozen
from schemas.recipe.common import (
    LearningRate,
    LoraSpec,
    ModelSpec,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Seed,
    Steps,
)
from schemas.recipe.kinds import DATASET_FOR, Port, StageSpec


class SFTConfig(Frozen):
    """Supervised format training with Tunix PeftTrainer."""

    max_steps: Steps
    """optimizer steps (at most 10,000,000:
    beyond any compute budget, inside 32-bit step counters)"""
    batch_size: PositiveInt
    """the micro-batch: rows per forward/backward pass"""
    gradient_accumulation_steps: PositiveInt = 1
    """'fit to tile': 8 on a v5e-8"""
    learning_rate: LearningRate = 1e-3
    """the peak, with a schedule"""
    lr_schedule: Literal["constant", "warmup_cosine"] = "warmup_cosine"
    """constant, or warmup_cosine (warmup_steps, then a cosine decay)."""
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    """Optimizer steps of linear warmup (warmup_cosine)."""
    weight_decay: NonNegativeFloat = 0.0
    """AdamW weight decay."""
    max_grad_norm: PositiveFloat | None = 1.0
    """Clip gradients to this global norm; null: no clipping."""
    lora: LoraSpec | None = Field(default_factory=LoraSpec)
    """null: train full weights"""
    checkpoint_every_steps: PositiveInt = 50
    """Save a checkpoint every this many optimizer steps."""
    keep_checkpoints: NonNegativeInt = 2
    """Saved steps kept, the newest; 0 keeps every one, so an evaluate node with `steps:
    saved` scores each and a pick node chooses among them (never shipping a worse step)."""
    checkpoint_every_seconds: PositiveFloat | None = None
    """also save on a timer"""
    save_margin_seconds: NonNegativeFloat = 60.0
    """kept free before a deadline"""
    seed: Seed = 0
    """Seeds the data order (0 to 2**31 - 1: Grain and NumPy refuse a negative seed)."""

    @model_validator(mode="after")
    def _warmup_fits(self) -> SFTConfig:
        if self.warmup_steps >= self.max_steps:
            raise ValueError(
                f"warmup_steps must be < max_steps, got {self.warmup_steps} >= {self.max_steps}"
            )
        return self


class DPOConfig(Frozen):
    """Preference optimisation with Tunix's DPO trainer: `algorithm` dpo or orpo."""

    algorithm: Literal["dpo", "orpo"] = "dpo"
    """dpo, or orpo (odds-ratio preference optimisation, no reference model)."""
    max_steps: Steps
    """Optimizer steps (at most 10,000,000:
    beyond any compute budget, inside 32-bit step counters)."""
    batch_size: PositiveInt = 2
    """Pairs per step."""
    learning_rate: LearningRate = 1e-4
    """The learning rate."""
    beta: PositiveFloat = 0.1
    """DPO's temperature on the log-ratio difference."""
    lambda_orpo: PositiveFloat = 0.1
    """ORPO's weight of the odds-ratio term."""
    logprobs: Literal["sum", "mean"] = "sum"
    """How a response's token log-probs make its sequence log-prob in the loss. sum: Tunix
    0.1.7's (its ORPO odds ratio then compares whole-sequence probabilities, which shrink
    with length); mean: averaged over the response's tokens, as TRL's ORPO and Tunix's later
    releases take them (DPO's log-ratios, policy and reference alike, averaged too). ORPO's
    NLL term is per-token either way (stages/modeling/preference_loss.py)."""
    max_response_len: PositiveInt = 32
    """Tokens a chosen or rejected response keeps (longer ones are cut)."""
    checkpoint_every_steps: PositiveInt = 50
    """Save a checkpoint every this many steps."""
    keep_checkpoints: NonNegativeInt = 2
    """Saved steps kept, the newest; 0 keeps every one, so an evaluate node with `steps:
    saved` scores each and a pick node chooses among them (never shipping a worse step)."""
    save_margin_seconds: NonNegativeFloat = 60.0
    """Kept free before a deadline."""
    seed: Seed = 0
    """Seeds the pair order (0 to 2**31 - 1: Grain and NumPy refuse a negative seed)."""


class DistillConfig(Frozen):
    """Logit distillation with Tunix's DistillationTrainer: a student learns a teacher's
    softened next-token distribution (KL at `temperature`, weight `alpha`) plus the task loss.

    `student` is the student's ModelSpec (None: the recipe's model); it may be smaller than
    the teacher but must share its tokenizer. `lora` trains adapters on the student, None
    trains its full weights.
    """

    student: ModelSpec | None = None
    """The student's ModelSpec; null: the recipe's model."""
    lora: LoraSpec | None = None
    """Adapters on the student; null: train its full weights."""
    max_steps: Steps
    """Optimizer steps (at most 10,000,000:
    beyond any compute budget, inside 32-bit step counters)."""
    batch_size: PositiveInt = 4
    """SFT rows per step."""
    learning_rate: LearningRate = 1e-3
    """The learning rate."""
    temperature: Annotated[float, Field(gt=0, le=20)] = 2.0
    """Softens both distributions for the KL term."""
    alpha: Annotated[float, Field(ge=0, le=1)] = 0.5
    """Weight of the distillation (KL) loss against the task loss."""
    checkpoint_every_steps: PositiveInt = 50
    """Save a checkpoint every this many steps."""
    keep_checkpoints: NonNegativeInt = 2
    """Saved steps kept, the newest; 0 keeps every one, so an evaluate node with `steps:
    saved` scores each and a pick node chooses among them (never shipping a worse step)."""
    save_margin_seconds: NonNegativeFloat = 60.0
    """Kept free before a deadline."""
    seed: Seed = 0
    """Seeds the data order (0 to 2**31 - 1: Grain and NumPy refuse a negative seed)."""


SFT_KIND = StageSpec(
    "sft",
    SFTConfig,
    "stages.sft:run",
    "checkpoint",
    {"dataset": DATASET_FOR["sft"], "policy": Port(("checkpoint",), required=False)},
    section="sft",
    progress=True,
    hash_exempt_defaults=("keep_checkpoints",),
    summary="Supervised format training (LoRA), from the base or a `policy`.",
)
"""The sft kind (stages/sft.py)."""
DPO_KIND = StageSpec(
    "dpo",
    DPOConfig,
    "stages.dpo:run",
    "checkpoint",
    {"policy": Port(("checkpoint",)), "preferences": Port(("preferences",))},
    hash_exempt_defaults=("keep_checkpoints", "logprobs"),
    summary="DPO or ORPO on preference pairs.",
)
"""The dpo kind (stages/dpo.py)."""
DISTILL_KIND = StageSpec(
    "distill",
    DistillConfig,
    "stages.distill:run",
    "checkpoint",
    {"dataset": DATASET_FOR["sft"], "teacher": Port(("checkpoint",))},
    hash_exempt_defaults=("keep_checkpoints",),
    summary="Logit distillation of a teacher into a student.",
)
"""The distill kind (stages/distill.py)."""
