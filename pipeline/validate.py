"""Everything about a run that can be checked before any compute, checked at once.

`far run` and the scheduled deployment call `validate_run` after the recipe parsed and before
the flow starts, so a wrong reward name, a mesh larger than the machine, an unreachable model,
a missing data file or evaluation checkpoint, or a storage root that cannot be written is
refused in seconds with one line naming the field or file, instead of after data-prep (or SFT)
already ran. Each check raises stages.core.errors.InputError.
"""

from __future__ import annotations

import uuid

from schemas.recipe import DataPrepConfig, EvalConfig, GRPOConfig, MeshSpec, ModelSpec, Recipe
from stages.core import storage
from stages.core.errors import InputError, MissingInput
from stages.core.runner import find_checkpoint_record

EVAL_STAGE_NAMES = ("base", "sft", "grpo")


def validate_run(recipe: Recipe, root: str, cache_dir: str) -> None:
    """Every check below, cheapest first; the first failure raises InputError."""
    check_rewards(recipe.grpo)
    check_storage_writable(root)
    check_data_files(recipe.data)
    check_eval_checkpoints(recipe.eval)
    check_mesh(recipe.mesh)
    check_model(recipe.model, cache_dir)


def check_rewards(config: GRPOConfig) -> None:
    from stages.rewards import REGISTRY

    for name in config.rewards:
        if name not in REGISTRY:
            raise InputError(
                f"grpo.rewards: unknown reward {name!r}; expected one of {sorted(REGISTRY)}"
            )


def check_storage_writable(root: str) -> None:
    """Write and delete a probe object under `root` (a local dir, gs:// bucket, memory://)."""
    probe = storage.join(root, f".far-write-probe-{uuid.uuid4().hex[:12]}")
    try:
        storage.write_bytes(probe, b"")
        storage.delete(probe)
    except OSError as e:
        raise InputError(
            f"storage_root {root} is not writable ({type(e).__name__}: {e}); expected a "
            f"directory or bucket this user can write"
        ) from e


def check_data_files(config: DataPrepConfig) -> None:
    for split in ("eval", "grpo", "sft"):
        for index, source in enumerate(getattr(config, split).sources):
            if source.kind == "file" and not storage.exists(source.name):
                raise MissingInput(
                    f"data.{split}.sources[{index}].name: data source file not found: {source.name}"
                )


def check_eval_checkpoints(config: EvalConfig) -> None:
    for index, name in enumerate(config.models):
        if name in EVAL_STAGE_NAMES:
            continue
        try:
            find_checkpoint_record(name)
        except FileNotFoundError as e:
            raise MissingInput(f"eval.models[{index}]: {e}") from e


def check_mesh(spec: MeshSpec) -> None:
    import jax  # deferred: the rest of validation needs no accelerator runtime

    needed, present = spec.fsdp * spec.tp, jax.device_count()
    if needed > present:
        raise InputError(
            f"mesh: fsdp={spec.fsdp} x tp={spec.tp} needs {needed} devices, this machine has "
            f"{present} ({jax.devices()[0].platform}); expected fsdp x tp <= {present}"
        )


def check_model(spec: ModelSpec, cache_dir: str) -> None:
    """The model's weights and tokenizer are reachable (downloaded or converted once, cached)."""
    from stages.modeling.tokenizers import build_tokenizer

    try:
        build_tokenizer(spec, cache_dir)
    except ImportError as e:
        raise InputError(f"model.source {spec.source!r}: {e}") from e
