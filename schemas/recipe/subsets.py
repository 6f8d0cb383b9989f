"""The configs of the stages that derive data or choose between policies: hard_subset,
self_teach, preferences and pick.

Part of the recipe schema (schemas/recipe/__init__.py says how the package is laid out).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from schemas.base import Frozen
from schemas.recipe.common import (
    Draw,
    NodeId,
    NonNegativeFloat,
    PositiveInt,
    SampleCount,
    SamplingTemperature,
    Seed,
)
from schemas.recipe.kinds import ALL_SPLITS, DATASET_FOR, Port, StageSpec


class HardSubsetConfig(Frozen):
    """Which prompts an evaluation says are still hard, kept as a dataset to train on again.

    `model` names the evaluated model (a label in the report) whose results decide. A prompt
    is hard when its mean correctness over samples is below `below` (and, with `above`, above
    that); when fewer than `min_prompts` are, the others nearest the band fill up to it (so a
    following GRPO batch fits).

    With a sampled evaluation of the policy GRPO starts from (samples >= the GRPO group size),
    `above: 0, below: 1` is DAPO's dynamic sampling done before training: prompts the policy
    always or never solves give groups of equal rewards and no gradient, and are dropped.

    `select: mode` keeps instead the prompts where the model's greedy answer (its mode) is
    wrong while its samples sometimes find the right one, plus `right_share` of greedy-right
    prompts: the prompts where training can move the mode rather than sharpen it.
    """

    model: Annotated[str, Field(min_length=1)]
    """The evaluated model (its label in the report) whose results decide."""
    below: Annotated[float, Field(gt=0, le=1)] = 1.0
    """A prompt is hard when its mean correctness is below this."""
    min_prompts: PositiveInt = 1
    """Keep at least this many prompts (those nearest the band fill up)."""
    above: Annotated[float, Field(ge=0, lt=1)] | None = None
    """Keep only prompts solved more often than this too: `above: 0` with `below: 1` keeps the
    informative band, prompts the model solves sometimes (a GRPO group of them has reward
    variance); the top-up to min_prompts then takes the prompts nearest the band."""
    by: Annotated[str, Field(pattern=r"^(correct|format|reward/[A-Za-z0-9_.-]+)$")] = "correct"
    """The per-sample outcome whose mean over a prompt's samples is its solve rate: `correct`
    (the evaluation's accuracy), `format`, or `reward/<name>` for a reward the evaluation
    scored (EvalConfig.rewards; a reward in [0, 1])."""

    select: Literal["rate", "mode"] = "rate"
    """`rate`: by the solve rate (`below`, `above`). `mode`: the prompts whose greedy answer
    is wrong but whose samples sometimes solve them (where the policy's mode, not its
    coverage, is at fault), read from an evaluation with `greedy: true` (the `<model>@greedy`
    row beside the sampled `<model>` row); `below` and `above` are then not used."""
    right_share: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """With `select: mode`, this share of the kept prompts is greedy-right prompts (those
    the samples solve least often first), so training on the wrong modes does not unlearn
    the right ones; 0: none."""
    gold_sft: bool = False
    """Also write the kept prompts' gold targets (data_prep's `data.gold_targets`) as the
    output's sft_train split, so an sft node trains on the same prompts as GRPO, with gold
    chains (a continued-SFT control). A row longer than the dataset's seq_len is left out and
    counted, as self_teach leaves out a completion that does not fit."""

    @model_validator(mode="after")
    def _band(self) -> HardSubsetConfig:
        if self.select == "rate" and self.right_share:
            raise ValueError(
                f"hard_subset.right_share={self.right_share} applies to select: mode; "
                f"got select: {self.select}"
            )
        if self.above is not None and self.above >= self.below:
            raise ValueError(
                f"hard_subset keeps solve rates in (above, below): above={self.above} must be "
                f"less than below={self.below}"
            )
        return self


class SelfTeachConfig(Frozen):
    """Sample k completions per prompt from a checkpoint; keep the ones the rewards verify.

    A completion is kept when every reward in `verify` scores at least `min_score`; at most
    `keep_per_prompt` distinct ones per prompt. The kept rows become an SFT split.
    """

    split: Literal["grpo_train", "eval"] = "grpo_train"
    """The dataset split whose prompts are sampled."""
    samples: SampleCount = 4
    """Completions sampled per prompt; at most 1024 (each is decoded, so more only multiplies
    the stage's time)."""
    temperature: SamplingTemperature = 0.9
    """Sampling temperature."""
    draw: Draw = "gumbel"
    """How each token is drawn: gumbel (Tunix's) or inverse_cdf (one uniform number per row;
    the same distribution, other tokens for a seed)."""
    max_generation_tokens: PositiveInt = 32
    """Tokens a completion may take."""
    batch_size: PositiveInt = 8
    """Prompts sampled at a time."""
    verify: list[str] = Field(default_factory=lambda: ["format_strict", "math_equivalent"])
    """Registered rewards a completion must pass (each scoring >= min_score)."""
    min_score: Annotated[float, Field(ge=0, le=1)] = 1.0
    """The score each reward in verify must reach."""
    keep_per_prompt: PositiveInt = 1
    """Most distinct completions kept per prompt."""
    seed: Seed = 0
    """Seeds sampling (0 to 2**31 - 1: Grain and NumPy refuse a negative seed)."""

    @field_validator("verify")
    @classmethod
    def _some_reward(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("verify must name at least one registered reward, got []")
        return value


class PreferencesConfig(Frozen):
    """Preference pairs (prompt, chosen, rejected) for DPO / ORPO.

    From a file (`file` a json / jsonl path or URI; `adapter` 'pairs' for prompt / chosen /
    rejected columns or 'ultrafeedback' for rated completions: best against worst), or, with
    no file, from the samples of the node's `samples` input (an evaluation or a GRPO stage):
    within each prompt's group, the best-rewarded completion against the worst, when their
    rewards differ by at least `min_margin`. `model` picks one evaluated model's samples.
    """

    file: str | None = None
    """A json / jsonl file (path or URI) of pairs; null: from the samples input."""
    adapter: Literal["pairs", "ultrafeedback"] = "pairs"
    """The file's layout: pairs (prompt, chosen, rejected) or ultrafeedback."""
    model: str | None = None
    """Which evaluated model's samples make pairs; null: all."""
    min_margin: NonNegativeFloat = 0.0
    """Least reward difference between chosen and rejected."""
    max_pairs: PositiveInt | None = None
    """Keep at most this many pairs; null: all."""
    pairing: Literal["best_worst", "mode"] = "best_worst"
    """`best_worst`: in each group the best-rewarded completion against the worst. `mode`
    (from an evaluation with `greedy: true`, `model` set): for each prompt whose greedy
    answer is wrong and one of whose samples is right, chosen = the first right sample with
    strict format, rejected = the greedy (wrong) completion."""

    @model_validator(mode="after")
    def _mode_names_model(self) -> PreferencesConfig:
        if self.pairing == "mode" and (self.model is None or self.file is not None):
            raise ValueError(
                f"preferences pairing: mode pairs a model's right samples against its own "
                f"greedy answer: it needs `model` (got {self.model!r}) and no `file` "
                f"(got {self.file!r})"
            )
        return self


class PickConfig(Frozen):
    """Choose between policies by greedy accuracy on the validation split, before the
    held-out eval split is scored: a run's output is never a policy that did worse there.

    `candidates` are input names of the node, each a checkpoint the node's `evaluation` (an
    evaluate node with `split: validation`) scored greedily (its row `<name>`, or
    `<name>@greedy` beside a sampled one). The first is the incumbent, the policy the others
    started from: another candidate is chosen only when its accuracy exceeds the incumbent's
    by more than `min_gain`, and the most accurate such one wins (ties: the earlier listed).
    With `max_p` set, a candidate must also beat the incumbent on the same prompts by the
    exact McNemar test (its wins against its losses) at p <= max_p: on 256 validation prompts
    a gain of 0.008 (11 won, 9 lost) is noise, and picking it would ship noise as a choice.
    When the evaluation scored saved steps too (`steps: saved`), each earlier step of a
    candidate other than the incumbent is a choice of its own, and the output is the chosen
    checkpoint at that step.
    """

    candidates: list[NodeId] = Field(min_length=2)
    """Input names of the checkpoints to choose between; the first is the incumbent."""
    min_gain: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """How much more validation accuracy than the incumbent's a candidate needs."""
    max_p: Annotated[float, Field(gt=0, le=1)] | None = None
    """When set, the largest exact McNemar p-value (two-sided, the candidate's wins against
    the incumbent's on the validation prompts) at which a candidate may replace the
    incumbent; unset, any gain above `min_gain` does. Each candidate is tested on its own
    unless `correction` says otherwise, so with k choices the chance that one of k equally
    good ones passes is up to k * max_p."""
    correction: Literal["none", "holm"] = "none"
    """`holm`: `max_p` bounds the chance that any of the k choices (every candidate but the
    incumbent, and each saved step of one) replaces an equally good incumbent, not each one's
    alone: each choice's McNemar p-value is Holm-adjusted over the k (the smallest times k,
    the next times k - 1, ...; choice.json lists both). Needs `max_p`. `none`: each is tested
    on its own (reinforce-mode's 11 choices at max_p 0.05: up to 0.55 that one passes)."""

    @field_validator("candidates")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"pick.candidates must be distinct, got {value}")
        return value

    @model_validator(mode="after")
    def _correction_needs_max_p(self) -> PickConfig:
        if self.correction != "none" and self.max_p is None:
            raise ValueError(
                f"pick.correction {self.correction!r} adjusts p-values against max_p, but max_p "
                f"is unset; set max_p (for example 0.05) or correction: none"
            )
        return self


HARD_SUBSET_KIND = StageSpec(
    "hard_subset",
    HardSubsetConfig,
    "stages.hard_subset:run",
    "dataset",
    {  # the dataset: the evaluated one (its grpo_train) and its eval split
        "evaluation": Port(("eval_report",), producers=("evaluate",), trains_on_scored=True),
        "dataset": Port(("dataset",), frozenset({"grpo_train", "eval"})),
    },
    splits=frozenset({"grpo_train", "eval"}),
    hash_exempt_defaults=("above", "by", "select", "right_share", "gold_sft"),
    summary="The training prompts an evaluation says are still hard.",
)
"""The hard_subset kind (stages/hard_subset.py)."""
SELF_TEACH_KIND = StageSpec(
    "self_teach",
    SelfTeachConfig,
    "stages.self_teach:run",
    "dataset",
    {"dataset": DATASET_FOR["grpo"], "policy": Port(("checkpoint",))},
    splits=ALL_SPLITS,
    hash_exempt_defaults=("draw",),
    summary="SFT rows from a policy's own completions that the rewards verify.",
)
"""The self_teach kind (stages/self_teach.py)."""
PREFERENCES_KIND = StageSpec(
    "preferences",
    PreferencesConfig,
    "stages.preferences:run",
    "preferences",
    {  # none: pairs from config.file
        "samples": Port(
            ("eval_report", "checkpoint"), required=False, producers=("evaluate", "grpo")
        ),
        "dataset": Port(("dataset",), frozenset({"eval"}), required=False),
    },
    hash_exempt_defaults=("pairing",),
    summary="Preference pairs from a file or from sampled completions.",
)
"""The preferences kind (stages/preferences.py)."""
PICK_KIND = StageSpec(
    "pick",
    PickConfig,
    "stages.pick:run",
    "checkpoint",
    {"evaluation": Port(("eval_report",), producers=("evaluate",))},
    any_other_input=Port(("checkpoint",)),
    hash_exempt_defaults=("max_p", "correction"),
    summary="The policy with the best greedy accuracy on the validation split.",
)
"""The pick kind (stages/pick.py)."""
