"""The grpo stage's config: rewards (and their named presets), the RL algorithm, rollout,
clipping and the opt-in update settings.

Part of the recipe schema (schemas/recipe/__init__.py says how the package is laid out).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from schemas.base import Frozen
from schemas.recipe.common import (
    Draw,
    LearningRate,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SamplingTemperature,
    Seed,
    Steps,
)
from schemas.recipe.kinds import DATASET_FOR, Port, StageSpec

# Named reward weightings a recipe can ask for with `rewards: {preset: NAME}`.
REWARD_PRESETS: dict[str, dict[str, float]] = {
    # A trajectory weighting: 60% reasoning (format + shaping), 40% correctness.
    "trajectory_60_correctness_40": {
        "format_strict": 0.3,
        "reasoning_quality": 0.3,
        "math_equivalent": 0.4,
    },
}


def _expand_reward_preset(value: object) -> object:
    """`{preset: NAME}` -> that preset's weights; any other value is left to validation."""
    if not (isinstance(value, dict) and set(value) == {"preset"}):
        return value
    name = value["preset"]
    if name not in REWARD_PRESETS:
        raise ValueError(f"unknown reward preset {name!r}; presets: {sorted(REWARD_PRESETS)}")
    return dict(REWARD_PRESETS[name])


GRPOAlgorithm = Literal["grpo", "gspo-token", "dapo", "dr-grpo"]

MAX_REWARD_WEIGHT = 1e6
"""The largest |weight| a reward may have. Rewards score on the order of 1; a larger weight is
a typo, and a bound keeps a weighted sum of sane rewards, and the group statistics GRPO takes
of it (squares, in the std), far from float overflow, which would train on inf or NaN."""


class OverlongPenalty(Frozen):
    """DAPO's soft overlong punishment: a completion longer than `max_chars - buffer_chars`
    loses up to `penalty` reward, linearly over the buffer. Tunix measures the length in
    characters of the decoded completion, not in tokens."""

    buffer_chars: PositiveInt
    """Characters before max_chars over which the penalty grows linearly."""
    max_chars: PositiveInt
    """The completion length (characters) at which the full penalty applies."""
    penalty: NonNegativeFloat = 1.0
    """The most reward an overlong completion loses."""

    @model_validator(mode="after")
    def _buffer_fits(self) -> OverlongPenalty:
        if self.buffer_chars >= self.max_chars:
            raise ValueError(
                f"buffer_chars must be < max_chars, got {self.buffer_chars} >= {self.max_chars}"
            )
        return self


class GRPOConfig(Frozen):
    """Reinforcement with Tunix's RL learners: rollout, rewards (by registered name), loss.

    algorithm: grpo (GRPOLearner), gspo-token (GRPOLearner with the sequence-level GSPO
    loss), dapo (DAPOLearner: no KL term, so beta must be 0; asymmetric clipping with
    `epsilon_high`; optional overlong penalty) or dr-grpo (DrGRPOLearner: advantages without
    the per-group std division, loss scaled by a constant token count). Tunix 0.1.7's
    DAPOConfig.dynamic_sampling is a flag its learner never reads, so it is not offered here.

    The optimizer defaults are those of Tunix's GRPO examples: AdamW at 3e-6 with b1 0.9,
    b2 0.99, weight decay 0.1, a linear warmup over the first 10% of the updates then a
    cosine decay (to 10% of the peak), gradients clipped to global norm 0.1.
    """

    max_steps: Steps
    """GRPO steps (each: a batch of prompts, rollouts, rewards, policy updates); at most
    10,000,000: beyond any compute budget, inside 32-bit step counters."""
    batch_size: PositiveInt
    """prompts per step; each gets num_generations completions"""
    train_micro_batch_size: PositiveInt | None = None
    """Prompts per backward pass (null: batch_size). The actor update's memory grows with
    its rows and its time barely depends on how they are split: on reinforce-mode (Gemma 3
    270M, 4 prompts x 8 completions of 96 positions) GRPO's peak resident memory was 15.4 GB
    with null and 9.9 GB with 1, at 0.57 and 0.63 completions/s (docs/log.md, 2026-11-27).
    Gradients are accumulated over batch_size / train_micro_batch_size passes (equal to float
    rounding); the step's rollout stays one batch of batch_size prompts."""
    num_generations: Annotated[int, Field(ge=2)] = 4
    """Completions sampled per prompt (the group GRPO compares)."""
    num_iterations: PositiveInt = 1
    """policy updates per batch (mu in the GRPO paper)"""
    algorithm: GRPOAlgorithm = "grpo"
    """grpo, gspo-token, dapo or dr-grpo (see above)."""
    max_generation_tokens: PositiveInt = 32
    """Tokens a rollout completion may take."""
    temperature: SamplingTemperature = 0.9
    """Rollout sampling temperature."""
    top_p: Annotated[float, Field(gt=0, le=1)] | None = 1.0
    """Rollout nucleus sampling; null or 1.0: off."""
    top_k: PositiveInt | None = None
    """Rollout top-k sampling; null: off."""
    draw: Draw = "gumbel"
    """How a rollout draws each sampled token (unfiltered sampling: top_p 1 or null, top_k
    null). gumbel: Tunix's own, one random number per vocabulary entry and row; inverse_cdf:
    one uniform number per row (stages/modeling/sampling.py), the same distribution, other
    tokens for a given seed, and on 2 CPU cores a 32 x 32 rollout of Gemma 3 270M in 7.7 s
    instead of 10.2 s, greedy taking 7.5 s (bench/sampling_cost.py)."""
    beta: NonNegativeFloat = 0.04
    """Weight of the KL penalty to the reference (SFT) policy; 0 for dapo."""
    epsilon: Annotated[float, Field(gt=0, lt=1)] = 0.2
    """The policy-ratio clip (lower, and upper unless epsilon_high)."""
    epsilon_high: PositiveFloat | None = None
    """dapo only: upper clip (DAPO paper: 0.28)"""
    overlong_penalty: OverlongPenalty | None = None
    """dapo only"""
    learning_rate: LearningRate = 3e-6
    """the peak, with lr_schedule"""
    lr_schedule: Literal["constant", "warmup_cosine"] = "warmup_cosine"
    """constant, or warmup_cosine (warmup_fraction, then a cosine decay to 10%)."""
    warmup_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.1
    """of the optimizer updates"""
    weight_decay: NonNegativeFloat = 0.1
    """AdamW weight decay."""
    adam_b1: Annotated[float, Field(ge=0, lt=1)] = 0.9
    """AdamW beta1."""
    adam_b2: Annotated[float, Field(ge=0, lt=1)] = 0.99
    """AdamW beta2."""
    max_grad_norm: PositiveFloat | None = 0.1
    """null: no clipping"""
    rewards: Annotated[dict[str, float], BeforeValidator(_expand_reward_preset)] = Field(
        default_factory=lambda: {"format_strict": 1.0, "answer_match": 1.0}
    )
    """reward name -> weight, or {preset: NAME} for one of REWARD_PRESETS"""
    checkpoint_every_steps: PositiveInt = 50
    """Save a checkpoint every this many GRPO steps."""
    keep_checkpoints: NonNegativeInt = 2
    """Saved steps kept, the newest; 0 keeps every one, so an evaluate node with `steps:
    saved` scores each and a pick node chooses among them (never shipping a worse step)."""
    save_margin_seconds: NonNegativeFloat = 60.0
    """kept free before a deadline"""
    samples_per_step: Annotated[int, Field(ge=0, le=64)] = 4
    """completions kept in samples.jsonl"""
    seed: Seed = 0
    """Seeds the prompt order and, with the global step, each step's rollout sampling key
    (0 to 2**31 - 1: Grain and NumPy refuse a negative seed)."""
    flat_groups: Literal["count", "drop"] = "count"
    """A group whose completions all earn the same reward has zero advantage. `count`: its
    completions still count in the loss's mean over sequences (Tunix's GRPO), diluting the
    informative groups' gradient; `drop`: they are left out of that mean (the informative
    groups' advantages scaled by groups / informative groups; grpo and gspo-token only)."""
    trim_padding: PositiveInt | None = None
    """null: the actor update runs, forward and backward, over every prompt padded to
    max_prompt_len and every completion to max_generation_tokens, as Tunix pads them. N:
    before the update, each step's examples lose the columns no row uses, the prompts' and
    the completions' each kept to the step's longest rounded up to a multiple of N (a larger
    N: fewer compiled shapes of the actor's step, more padding left). Same tokens at the same
    positions: loss and gradients equal to float rounding, not bit for bit. dr-grpo keeps the
    completion's width (its loss divides by it); the reference and old-policy log-probs are
    still computed at the full width, then cut."""
    skip_flat_groups: bool = False
    """true: the actor update leaves out the groups whose advantages are all 0 (no reward
    spread), whose rows add exactly 0 to the loss and its gradient without a KL term, keeping
    the informative groups (filled with flat ones up to a power-of-two count of groups, for
    few compiled shapes) with their advantages scaled so that the loss and gradients equal
    the full step's to float rounding. Needs beta 0, algorithm grpo or gspo-token and one
    micro-batch a step (train_micro_batch_size null or batch_size)."""
    share_prompts: bool = False
    """true: each group's prompt runs through the model once, not once per completion (Tunix
    repeats it num_generations times): in the rollout's prefill, whose first token is then
    drawn for every row, and in the actor update, whose completions run on the prompt's keys
    and values. Same tokens at the same positions: completions, loss and gradients equal to
    float rounding, not bit for bit. The actor update's part is Gemma 3's (other families,
    and sequences longer than a sliding-window layer's window, run the full pass); needs one
    micro-batch a step (train_micro_batch_size null or batch_size)."""
    oversample: Annotated[int, Field(ge=1, le=8)] = 1
    """Prompts rolled out a step, in multiples of batch_size (DAPO's dynamic sampling, arXiv
    2503.14476, as one batched rollout). Above 1: each step samples num_generations
    completions for oversample x batch_size prompts, then the actor update keeps batch_size
    of the groups, those with reward spread first (in the prompts' order), flat ones filling
    up when too few have spread; its loss is GRPO's on the kept groups as if only they had
    been sampled (flat_groups applies among them). A step takes oversample x batch_size
    prompts from the pool, so epochs pass that much faster. grpo and gspo-token only; needs
    one micro-batch a step (train_micro_batch_size null or batch_size)."""
    sampler_projection: Literal["float32", "bfloat16"] = "float32"
    """The rollout's output projection (hidden state to vocabulary logits, every decode
    step). `bfloat16`: a bfloat16 copy of Gemma 3's tied embedding, made once, with bfloat16
    operands and float32 sums: on 2 CPU cores a decode step's projection at 32 rows takes
    about half the float32 one's time (docs/performance.md). Other logits, so other sampled
    completions for a seed; the actor's log-probs and loss keep the float32 table. Gemma 3
    with a LoRA policy only (the copy is never updated, so the embedding must not train)."""
    baseline: Literal["group", "greedy"] = "group"
    """What a completion's reward is compared with. `group`: the mean of its group (Tunix's
    GRPO, normalized by the group's std). `greedy` (ReMax, arXiv 2310.10505): the reward of
    the current policy's greedy completion of the same prompt, decoded each step; the
    advantage is r(sample) - r(greedy), not divided by anything, so a sample that only agrees
    with the greedy answer earns nothing and sharpening a wrong mode is not paid (grpo and
    gspo-token only; not with flat_groups: drop, whose flat groups are a group-mean notion)."""

    @field_validator("rewards")
    @classmethod
    def _some_reward(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("rewards must name at least one registered reward, got {}")
        for name, weight in value.items():
            if not math.isfinite(weight) or abs(weight) > MAX_REWARD_WEIGHT:
                raise ValueError(
                    f"reward {name!r} has weight {weight}; expected a finite number within "
                    f"[-{MAX_REWARD_WEIGHT:g}, {MAX_REWARD_WEIGHT:g}] (rewards score on the "
                    f"order of 1: a larger weight overflows the summed reward)"
                )
        if all(weight == 0 for weight in value.values()):
            raise ValueError(
                f"every reward weight is 0 ({value}), so every completion scores 0 and GRPO "
                f"learns nothing; give at least one reward a non-zero weight"
            )
        return value

    @model_validator(mode="after")
    def _algorithm_knobs(self) -> GRPOConfig:
        self._greedy_baseline_knobs()
        self._skip_flat_groups_knobs()
        self._oversample_knobs()
        if self.share_prompts:
            self._one_micro_batch("share_prompts")
        self._draw_knobs()
        if self.flat_groups == "drop" and self.algorithm not in ("grpo", "gspo-token"):
            raise ValueError(
                f"flat_groups: drop rescales GRPO's group advantages; algorithm is "
                f"{self.algorithm!r} (use grpo or gspo-token, or flat_groups: count)"
            )
        if self.algorithm != "dapo":
            for name in ("epsilon_high", "overlong_penalty"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} is a DAPO knob; algorithm is {self.algorithm!r} (set "
                        f"algorithm: dapo or remove {name})"
                    )
            return self
        if self.beta != 0:
            raise ValueError(f"dapo has no KL term: set beta: 0 (got beta={self.beta})")
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise ValueError(
                f"epsilon_high must be >= epsilon, got {self.epsilon_high} < {self.epsilon}"
            )
        return self

    def _skip_flat_groups_knobs(self) -> None:
        if not self.skip_flat_groups:
            return
        if self.beta != 0:
            raise ValueError(
                f"skip_flat_groups needs beta: 0 (got beta={self.beta}): the KL term of a "
                f"group without reward spread is not 0, so its rows cannot be left out"
            )
        if self.algorithm not in ("grpo", "gspo-token"):
            raise ValueError(
                f"skip_flat_groups rescales GRPO's sequence-mean loss; algorithm is "
                f"{self.algorithm!r} (use grpo or gspo-token, or skip_flat_groups: false)"
            )
        self._one_micro_batch("skip_flat_groups")

    def _oversample_knobs(self) -> None:
        if self.oversample == 1:
            return
        if self.algorithm not in ("grpo", "gspo-token"):
            raise ValueError(
                f"oversample keeps GRPO groups by their advantages and rescales GRPO's "
                f"sequence-mean loss; algorithm is {self.algorithm!r} (use grpo or gspo-token, "
                f"or oversample: 1)"
            )
        self._one_micro_batch("oversample")

    def _one_micro_batch(self, knob: str) -> None:
        """`knob` changes the rows of a step's example, which Tunix's micro-batch split
        slices by the step's row count."""
        micro = self.train_micro_batch_size
        if micro is not None and micro != self.batch_size:
            raise ValueError(
                f"{knob} needs one micro-batch a step: train_micro_batch_size is "
                f"{micro}, batch_size {self.batch_size} (set it to null or {self.batch_size})"
            )

    def _draw_knobs(self) -> None:
        filtered = (self.top_p is not None and self.top_p < 1) or self.top_k is not None
        if self.draw == "inverse_cdf" and filtered:
            raise ValueError(
                f"draw: inverse_cdf draws from the whole vocabulary; top_p is {self.top_p} "
                f"and top_k {self.top_k} (set top_p: 1.0 and top_k: null, or draw: gumbel)"
            )

    def _greedy_baseline_knobs(self) -> None:
        if self.baseline != "greedy":
            return
        if self.algorithm not in ("grpo", "gspo-token"):
            raise ValueError(
                f"baseline: greedy replaces GRPO's group advantages; algorithm is "
                f"{self.algorithm!r}, whose learner computes its own (use grpo or gspo-token, "
                f"or baseline: group)"
            )
        if self.flat_groups == "drop":
            raise ValueError(
                "baseline: greedy cannot honour flat_groups: drop: a group whose samples all "
                "earn the same reward still has an advantage when the greedy reward differs, "
                "and rows that match the greedy reward already get 0 (set flat_groups: count "
                "or baseline: group)"
            )


GRPO_KIND = StageSpec(
    "grpo",
    GRPOConfig,
    "stages.grpo.training:run",
    "checkpoint",
    {"dataset": DATASET_FOR["grpo"], "policy": Port(("checkpoint",))},
    section="grpo",
    progress=True,
    hash_exempt_defaults=(
        "flat_groups",
        "keep_checkpoints",
        "baseline",
        "trim_padding",
        "skip_flat_groups",
        "draw",
        "share_prompts",
        "sampler_projection",
        "oversample",
    ),
    summary="Reinforcement on the rewards (GRPO and its variants).",
)
"""The grpo kind (stages/grpo/training.py)."""
