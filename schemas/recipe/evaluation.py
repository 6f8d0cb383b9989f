"""The `eval` section: which models an evaluation scores, on which split, and how it decodes.

Part of the recipe schema (schemas/recipe/__init__.py says how the package is laid out).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from schemas.base import Frozen
from schemas.recipe.common import (
    _NODE_ID,
    EVAL_MODELS,
    MAX_SAMPLING_TEMPERATURE,
    Draw,
    PositiveInt,
    SampleCount,
    Seed,
)
from schemas.recipe.kinds import Port, StageSpec


class EvalConfig(Frozen):
    """Generation on the held-out prompts for each listed model, then metrics.

    models: 'base', 'sft', 'grpo' (this run's stages) or any checkpoint URI (another run's
    checkpoint is scored in this run's records only; that run is never written).
    temperature 0 is greedy (batched outputs equal batch-size-1 outputs); with a temperature,
    `samples` completions per prompt give pass@k (unbiased, k = 1, 2, 4, ... samples),
    majority-vote accuracy and the headroom table (stages/evaluate/headroom.py). Every rate gets
    a Wilson 95% interval and each model is compared with the one listed before it on the
    same prompts (exact McNemar test). `split` is the prompts scored: the held-out `eval`
    split, or `grpo_train` to find training prompts a model still fails (hard_subset) while
    the eval split stays held out.
    """

    models: list[str] = Field(default_factory=lambda: [str(m) for m in EVAL_MODELS], min_length=1)
    """The models to evaluate, each compared with the one before it."""
    base_shots: Annotated[int, Field(ge=0, le=16)] = 3
    """'base' is also evaluated with this many worked examples from the SFT training split before
    each prompt (never from the evaluation split); 0: zero-shot only"""
    max_generation_tokens: PositiveInt = 32
    """Tokens a completion may take."""
    batch_size: PositiveInt = 8
    """Prompts decoded at a time."""
    temperature: Annotated[float, Field(ge=0, le=MAX_SAMPLING_TEMPERATURE)] = 0.0
    """0: greedy decoding; above 0: sampled, with `samples` per prompt."""
    samples: SampleCount = 1
    """Completions per prompt (needs temperature > 0 when above 1); at most 1024 (pass@1024;
    each sample is decoded, so more only multiplies the stage's time)."""
    draw: Draw = "gumbel"
    """How a sampled completion draws each token: gumbel (Tunix's) or inverse_cdf (one
    uniform number per row; the same distribution, other tokens for a seed; needs a
    temperature)."""
    seed: Seed = 0
    """Seeds sampling (0 to 2**31 - 1: Grain and NumPy refuse a negative seed)."""
    steps: Literal["last", "saved"] = "last"
    """last: each checkpoint at the step its stage committed; saved: also every earlier step
    its stage kept (`keep_checkpoints`) on its save grid (multiples of its
    `checkpoint_every_steps`; not a save a session's stop forced, nor the first step Orbax
    saves), a row `<model>@step<N>` each, so a pick node can choose the best step (the
    committed one stays the row `<model>`)."""
    split: Literal["eval", "grpo_train", "validation"] = "eval"
    """The prompts scored: eval (held out), grpo_train (for hard_subset), or validation (for
    a pick node's choice between policies)."""
    greedy: bool = False
    """With samples > 1: also decode each model greedily, a row `<model>@greedy` beside it, so
    the report's headroom table sets pass@k against greedy accuracy."""
    max_prompts: PositiveInt | None = None
    """Score only the split's first `max_prompts` prompts (in the split's order: the same
    prompts for every model and every run of the split); unset: all of them. Sampling k
    completions a prompt costs k greedy evaluations, so a recipe can sample fewer prompts than
    it scores greedily (reinforce-mode: greedy on 512, sampled on the first 256)."""
    tag: Annotated[str, Field(min_length=1)] | None = None
    """Score only the split's rows whose source carries this `tag` (SourceSpec `tag`), before
    `max_prompts` applies: one level of a held-out split drawn from several; null: every
    row."""
    rewards: list[str] = Field(default_factory=list)
    """Registered rewards also scored on every sample (its row in samples.jsonl gets
    `reward/<name>`, the report the mean per model): a hard_subset can then select by the
    reward a GRPO node trains on (`by: reward/<name>`)."""

    @field_validator("models")
    @classmethod
    def _known_models(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in EVAL_MODELS and "/" not in name and not _NODE_ID.match(name):
                raise ValueError(
                    f"eval model {name!r} is neither one of {list(EVAL_MODELS)}, a pipeline "
                    f"node id, nor a checkpoint URI"
                )
        return value

    @model_validator(mode="after")
    def _sampling(self) -> EvalConfig:
        if self.greedy and self.samples < 2:
            raise ValueError(
                f"greedy: true adds a greedy row beside a sampled one; it needs samples >= 2 "
                f"and a temperature, got samples={self.samples}"
            )
        if self.draw != "gumbel" and self.temperature == 0:
            raise ValueError(
                f"draw: {self.draw} chooses how sampled tokens are drawn; temperature is 0 "
                f"(greedy): set a temperature or remove draw"
            )
        if self.samples > 1 and self.temperature == 0:
            raise ValueError(
                f"samples={self.samples} needs a temperature > 0 (greedy "
                f"decoding gives the same completion every time)"
            )
        return self


EVALUATE_KIND = StageSpec(
    "evaluate",
    EvalConfig,
    "stages.evaluate.evaluation:run",
    "eval_report",
    {"dataset": Port(("dataset",), frozenset({"eval"}), split_field="split")},
    any_other_input=Port(("checkpoint",)),
    section="eval",
    progress=True,
    hash_exempt_defaults=(
        "split",
        "greedy",
        "rewards",
        "steps",
        "max_prompts",
        "draw",
        "tag",
    ),
    summary="Format rate and accuracy of each model compared.",
)
"""The evaluate kind (stages/evaluate/evaluation.py)."""
