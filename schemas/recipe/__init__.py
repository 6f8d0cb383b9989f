"""Recipes: one YAML file names a whole FAR run (model, data, each stage's config, storage).

A recipe is validated in full before any compute starts, so a typo in the GRPO section fails
in a second on a laptop rather than hours into a TPU session. Every model here is frozen and
rejects unknown fields; validators say which value they got and what they expected.

The schema is split by section, one module each, and this package re-exports every name, so
`from schemas.recipe import X` reads any of them:

- common: number and duration types, the mesh, the model and its LoRA adapters;
- data: sources, column maps, splits, the prompt format (the `data` section);
- training: SFT, GRPO, DPO / ORPO and distillation configs;
- evaluation: the `eval` section;
- subsets: hard_subset, self_teach, preferences and pick configs;
- runtime: the sandbox and logging sections (never hashed, never drift);
- nodes: the `pipeline:` nodes, assembled from the shipped kinds' declarations;
- recipe: the Recipe itself and the checks that span sections.

A section's module imports only schemas.base and the modules above it in this list.
"""

from schemas.recipe.common import (
    _DURATION,
    _DURATION_PART,
    _MODULE,
    _NODE_ID,
    _UNIT_SECONDS,
    BYTE_TOKENIZER_VOCAB,
    EVAL_BATCH_SLACK,
    EVAL_MODELS,
    GEMMA_LORA_TARGETS,
    GENERATION_PER_ROW,
    MAX_SAMPLING_TEMPERATURE,
    STORAGE_SCHEMES,
    Architecture,
    Duration,
    EvalModel,
    Family,
    LearningRate,
    LoraSpec,
    MeshSpec,
    ModelSource,
    ModelSpec,
    NodeId,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Preset,
    SamplingTemperature,
    parse_duration,
)
from schemas.recipe.data import (
    OLMO_EVAL_TASKS,
    PRESET_COLUMNS,
    Adapter,
    AnswerFormat,
    ChatTemplateKind,
    ColumnMap,
    DataPrepConfig,
    Domain,
    PromptFormat,
    SourceKind,
    SourceSpec,
    SplitSpec,
    _unset,
)
from schemas.recipe.evaluation import (
    EvalConfig,
)
from schemas.recipe.nodes import (
    REGISTERED,
    SHIPPED_NODES,
    DataPrepNode,
    DistillNode,
    DPONode,
    EvaluateNode,
    GRPONode,
    HardSubsetNode,
    Node,
    PickNode,
    PreferencesNode,
    RegisteredNode,
    SelfTeachNode,
    SFTNode,
    StageNode,
    _node_tag,
)
from schemas.recipe.recipe import (
    Recipe,
)
from schemas.recipe.runtime import (
    LoggingConfig,
    SandboxConfig,
)
from schemas.recipe.subsets import (
    HardSubsetConfig,
    PickConfig,
    PreferencesConfig,
    SelfTeachConfig,
)
from schemas.recipe.training import (
    REWARD_PRESETS,
    DistillConfig,
    DPOConfig,
    GRPOAlgorithm,
    GRPOConfig,
    OverlongPenalty,
    SFTConfig,
    _expand_reward_preset,
)

__all__ = [
    "BYTE_TOKENIZER_VOCAB",
    "EVAL_BATCH_SLACK",
    "EVAL_MODELS",
    "GEMMA_LORA_TARGETS",
    "GENERATION_PER_ROW",
    "MAX_SAMPLING_TEMPERATURE",
    "OLMO_EVAL_TASKS",
    "PRESET_COLUMNS",
    "REGISTERED",
    "REWARD_PRESETS",
    "SHIPPED_NODES",
    "STORAGE_SCHEMES",
    "_DURATION",
    "_DURATION_PART",
    "_MODULE",
    "_NODE_ID",
    "_UNIT_SECONDS",
    "Adapter",
    "AnswerFormat",
    "Architecture",
    "ChatTemplateKind",
    "ColumnMap",
    "DPOConfig",
    "DPONode",
    "DataPrepConfig",
    "DataPrepNode",
    "DistillConfig",
    "DistillNode",
    "Domain",
    "Duration",
    "EvalConfig",
    "EvalModel",
    "EvaluateNode",
    "Family",
    "GRPOAlgorithm",
    "GRPOConfig",
    "GRPONode",
    "HardSubsetConfig",
    "HardSubsetNode",
    "LearningRate",
    "LoggingConfig",
    "LoraSpec",
    "MeshSpec",
    "ModelSource",
    "ModelSpec",
    "Node",
    "NodeId",
    "NonNegativeFloat",
    "NonNegativeInt",
    "OverlongPenalty",
    "PickConfig",
    "PickNode",
    "PositiveFloat",
    "PositiveInt",
    "PreferencesConfig",
    "PreferencesNode",
    "Preset",
    "PromptFormat",
    "Recipe",
    "RegisteredNode",
    "SFTConfig",
    "SFTNode",
    "SamplingTemperature",
    "SandboxConfig",
    "SelfTeachConfig",
    "SelfTeachNode",
    "SourceKind",
    "SourceSpec",
    "SplitSpec",
    "StageNode",
    "_expand_reward_preset",
    "_node_tag",
    "_unset",
    "parse_duration",
]
