"""The whole recipe: one YAML file names a FAR run (model, data, each stage's config,
storage, the pipeline), and the checks that need more than one section.

Part of the recipe schema (schemas/recipe/__init__.py says how the package is laid out).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from schemas.base import Frozen
from schemas.recipe.common import (
    _MODULE,
    EVAL_BATCH_SLACK,
    GENERATION_PER_ROW,
    STORAGE_SCHEMES,
    Duration,
    LoraSpec,
    MeshSpec,
    ModelSpec,
)
from schemas.recipe.data import DataPrepConfig
from schemas.recipe.evaluation import EvalConfig
from schemas.recipe.grpo import GRPOConfig
from schemas.recipe.nodes import DataPrepNode, GRPONode, StageNode
from schemas.recipe.runtime import LoggingConfig, SandboxConfig
from schemas.recipe.training import DistillConfig, SFTConfig


class Recipe(Frozen):
    """A whole FAR run. `name` plus `storage_root` locate it: {storage_root}/{name}/."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]
    """The run's name: its directory under storage_root, {storage_root}/{name}/."""
    storage_root: str
    """Where runs are written: a local path, or a file://, memory:// or gs:// URI."""
    session_budget: Duration | None = None
    """Stop cleanly (saving) after this long, e.g. 9h, 90m; null: no budget. Not drift."""
    model: ModelSpec
    """The network, its weights and tokenizer (see ModelSpec)."""
    mesh: MeshSpec = Field(default_factory=MeshSpec)
    """The device mesh (see MeshSpec); not drift: a run may continue on another mesh."""
    data: DataPrepConfig
    """data_prep's config: the sft, grpo and eval splits and their sources."""
    sft: SFTConfig
    """The SFT stage's config (and of sft nodes without their own)."""
    grpo: GRPOConfig
    """The GRPO stage's config (and of grpo nodes without their own)."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """The evaluation's config (and the default of evaluate nodes)."""
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    """How rewards run model-written code and math (see SandboxConfig); not drift."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Where training curves go: TensorBoard, MLflow, W&B (see LoggingConfig); not drift."""
    pipeline: list[StageNode] | None = Field(default=None, min_length=1)
    """The stages and their inputs as a DAG; None: data_prep -> sft -> grpo -> evaluate."""
    allow_negative_reward_weights: bool = False
    """A negative reward weight turns a reward into a penalty; refused unless said here."""
    allow_long_sft_targets: bool = False
    """An SFT target longer than the smallest `max_generation_tokens` of the run teaches the
    model an answer that generation cuts off before it closes (format 0 for that row), so
    `far validate` and `far run` refuse such a recipe, with the token counts; true accepts it
    (a few long rows among many), with one warning naming the longest. Not drift, and in no
    stage hash."""
    plugins: list[str] = Field(default_factory=list)
    """Python modules imported before the rest of the recipe is read, as `--plugin MODULE`
    does: each registers stage kinds and/or rewards the recipe names (docs/your-own-task.md),
    so a scheduled deployment needs no flag. Not drift, and in no stage hash: a stage that
    uses a plugin's reward hashes the reward's source file instead."""

    @field_validator("storage_root")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in STORAGE_SCHEMES:
            raise ValueError(
                f"storage_root must be a local path or a file://, memory:// or gs:// URI, "
                f"got {value!r}"
            )
        if not value.strip():
            raise ValueError("storage_root must not be empty")
        return value

    @field_validator("plugins")
    @classmethod
    def _module_names(cls, value: list[str]) -> list[str]:
        for index, module in enumerate(value):
            if not _MODULE.match(module):
                raise ValueError(
                    f"plugins[{index}]: {module!r} is not a dotted module name; expected one "
                    f"such as my_task.rewards (a module on the Python path)"
                )
        repeated = sorted({m for m in value if value.count(m) > 1})
        if repeated:
            raise ValueError(f"plugins names {repeated} more than once; list each module once")
        return value

    @field_validator("session_budget")
    @classmethod
    def _positive_budget(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value.total_seconds() <= 0:
            raise ValueError(f"session_budget must be positive, got {value}")
        return value

    @model_validator(mode="after")
    def _mlflow_store_reachable(self) -> Recipe:
        local = "://" not in self.storage_root or self.storage_root.startswith("file://")
        if self.logging.mlflow and self.logging.mlflow_tracking_uri is None and not local:
            raise ValueError(
                f"logging.mlflow: MLflow's default store is a SQLite file under the run, which "
                f"needs a local storage_root, got {self.storage_root!r}; set "
                f"logging.mlflow_tracking_uri (e.g. sqlite:////abs/path/mlflow.db or a server)"
            )
        return self

    @model_validator(mode="after")
    def _negative_weights_said(self) -> Recipe:
        if self.allow_negative_reward_weights:
            return self
        configs = [("grpo", self.grpo)] + [
            (f"pipeline node {n.id!r} config", n.config)
            for n in self.pipeline or []
            if isinstance(n, GRPONode) and n.config is not None
        ]
        for where, config in configs:
            negative = {k: w for k, w in config.rewards.items() if w < 0}
            if negative:
                raise ValueError(
                    f"{where}.rewards: negative weight(s) {negative} punish what the reward "
                    f"measures; if that is meant, set allow_negative_reward_weights: true"
                )
        return self

    @model_validator(mode="after")
    def _sizes_sensible(self) -> Recipe:
        """Values each field allows alone but that make no sense beside the rest: a completion
        longer than GENERATION_PER_ROW training rows, an evaluation batch past the completions
        its split gives, a LoRA rank above the model's width."""
        nodes = {n.id: n for n in self.pipeline or []}
        checks: list[tuple[str, Any]] = [
            ("sft", self.sft),
            ("grpo", self.grpo),
            ("eval", self.eval),
        ]
        checks += [(f"pipeline node {i!r} config", n.config) for i, n in nodes.items()]
        for where, config in checks:
            if config is None:
                continue
            tokens = getattr(config, "max_generation_tokens", None)
            limit = GENERATION_PER_ROW * self.data.max_seq_len
            if tokens is not None and tokens > limit:
                raise ValueError(
                    f"{where}.max_generation_tokens={tokens} is more than {GENERATION_PER_ROW} "
                    f"rows of data.max_seq_len={self.data.max_seq_len}; expected at most {limit}"
                )
            if isinstance(config, EvalConfig):
                self._eval_batch_fits(where, config)
            lora = getattr(config, "lora", None)
            arch = self.model.architecture
            if isinstance(config, DistillConfig) and config.student is not None:
                arch = config.student.architecture
            if isinstance(lora, LoraSpec) and arch is not None and lora.rank > arch.embed_dim:
                raise ValueError(
                    f"{where}.lora.rank={lora.rank} exceeds the model's embed_dim "
                    f"{arch.embed_dim}; expected a rank at most {arch.embed_dim}"
                )
        return self

    def _eval_batch_fits(self, where: str, config: EvalConfig) -> None:
        split = {"eval": self.data.eval, "grpo_train": self.data.grpo}.get(config.split)
        split = self.data.validation if config.split == "validation" else split
        own_data = any(isinstance(n, DataPrepNode) and n.config for n in self.pipeline or [])
        if split is None or own_data:  # the DAG check refuses a missing split
            return
        completions = split.size * config.samples
        most = max(EvalConfig.model_fields["batch_size"].default, EVAL_BATCH_SLACK * completions)
        if config.batch_size > most:
            raise ValueError(
                f"{where}.batch_size={config.batch_size} is more than {EVAL_BATCH_SLACK} times "
                f"the {completions} completions its split gives ({split.size} prompts x "
                f"{config.samples} samples), so most of each batch decodes repeats; expected at "
                f"most {most}"
            )

    @model_validator(mode="after")
    def _batches_fit(self) -> Recipe:
        micro = self.grpo.train_micro_batch_size
        if micro is not None and self.grpo.batch_size % micro:
            raise ValueError(
                f"grpo.batch_size must be a multiple of grpo.train_micro_batch_size, got "
                f"{self.grpo.batch_size} and {micro}"
            )
        if self.grpo.share_prompts and self.grpo.batch_size % self.mesh.fsdp:
            raise ValueError(
                f"grpo.share_prompts gives the actor update one prompt row a prompt, split over "
                f"the mesh's fsdp axis: grpo.batch_size ({self.grpo.batch_size}) must be a "
                f"multiple of mesh.fsdp ({self.mesh.fsdp})"
            )
        step = self.grpo.batch_size * self.grpo.oversample  # prompts rolled out a step
        if step > self.data.grpo.size:
            raise ValueError(
                f"grpo.batch_size x grpo.oversample (the prompts a step rolls out) must be <= "
                f"data.grpo.size, got {self.grpo.batch_size} x {self.grpo.oversample} > "
                f"{self.data.grpo.size}"
            )
        return self
