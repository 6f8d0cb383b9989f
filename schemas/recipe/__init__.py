"""Recipes: one YAML file names a whole FAR run (model, data, each stage's config, storage).

A recipe is validated in full before any compute starts, so a typo in the GRPO section fails
in a second on a laptop rather than hours into a TPU session. Every model here is frozen and
rejects unknown fields; validators say which value they got and what they expected.

The schema is split by section, one module each, and this package re-exports every name, so
`from schemas.recipe import X` reads any of them:

- common: number and duration types, the mesh, the model and its LoRA adapters;
- kinds: how a stage kind is declared (StageSpec, Port), shipped or plugged in;
- data: sources, column maps, splits, the prompt format (the `data` section);
- training: SFT, DPO / ORPO and distillation configs;
- grpo: the GRPO config, its algorithms and reward presets;
- evaluation: the `eval` section;
- subsets: hard_subset, self_teach, preferences and pick configs;
- runtime: the sandbox and logging sections (never hashed, never drift);
- nodes: the `pipeline:` nodes, assembled from the shipped kinds' declarations, each of
  which sits beside its config model (data_prep's in data, evaluate's in evaluation, ...);
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
    Draw,
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
    DATA_PREP_KIND,
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
    EVALUATE_KIND,
    EvalConfig,
)
from schemas.recipe.grpo import (
    GRPO_KIND,
    REWARD_PRESETS,
    GRPOAlgorithm,
    GRPOConfig,
    OverlongPenalty,
    _expand_reward_preset,
)
from schemas.recipe.kinds import (
    ALL_SPLITS,
    DATASET_FOR,
    SAYS,
    ArtifactKind,
    Port,
    Section,
    StageSpec,
)
from schemas.recipe.nodes import (
    REGISTERED,
    SHIPPED_KINDS,
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
    _config_field,
    _node_name,
    _node_tag,
    node_class,
)
from schemas.recipe.recipe import (
    Recipe,
)
from schemas.recipe.runtime import (
    LoggingConfig,
    SandboxConfig,
)
from schemas.recipe.subsets import (
    HARD_SUBSET_KIND,
    PICK_KIND,
    PREFERENCES_KIND,
    SELF_TEACH_KIND,
    HardSubsetConfig,
    PickConfig,
    PreferencesConfig,
    SelfTeachConfig,
)
from schemas.recipe.training import (
    DISTILL_KIND,
    DPO_KIND,
    SFT_KIND,
    DistillConfig,
    DPOConfig,
    SFTConfig,
)

__all__ = [
    "ALL_SPLITS",
    "BYTE_TOKENIZER_VOCAB",
    "DATASET_FOR",
    "DATA_PREP_KIND",
    "DISTILL_KIND",
    "DPO_KIND",
    "EVALUATE_KIND",
    "EVAL_BATCH_SLACK",
    "EVAL_MODELS",
    "GEMMA_LORA_TARGETS",
    "GENERATION_PER_ROW",
    "GRPO_KIND",
    "HARD_SUBSET_KIND",
    "MAX_SAMPLING_TEMPERATURE",
    "OLMO_EVAL_TASKS",
    "PICK_KIND",
    "PREFERENCES_KIND",
    "PRESET_COLUMNS",
    "REGISTERED",
    "REWARD_PRESETS",
    "SAYS",
    "SELF_TEACH_KIND",
    "SFT_KIND",
    "SHIPPED_KINDS",
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
    "ArtifactKind",
    "ChatTemplateKind",
    "ColumnMap",
    "DPOConfig",
    "DPONode",
    "DataPrepConfig",
    "DataPrepNode",
    "DistillConfig",
    "DistillNode",
    "Domain",
    "Draw",
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
    "Port",
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
    "Section",
    "SelfTeachConfig",
    "SelfTeachNode",
    "SourceKind",
    "SourceSpec",
    "SplitSpec",
    "StageNode",
    "StageSpec",
    "_config_field",
    "_expand_reward_preset",
    "_node_name",
    "_node_tag",
    "_unset",
    "node_class",
    "parse_duration",
]
