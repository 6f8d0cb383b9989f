"""SFT-format stage: teach the <reasoning>/<answer> format with Tunix PeftTrainer.

Entry point: `train(dataset, config, model, mesh, ctx, policy=None)
-> StageOutcome[CheckpointArtifact]`.

With a `policy` checkpoint the training continues from it (its LoRA adapters, or its full
weights) instead of fresh adapters; its LoRA spec must equal `config.lora`. Without one the
stage and its hash are what they always were.

The model is built from the recipe's ModelSpec, qwix LoRA is applied (or full weights are
trained), and PeftTrainer trains on the loss mask from data-prep. Orbax checkpoints go to the
stage directory's checkpoints/; PeftTrainer restores them itself, so a re-run after a crash
continues from the latest committed step (the grain pipeline is deterministic, so the batches
it skips are exactly the ones already trained on).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from tunix.sft import metrics_logger, peft_trainer

from schemas.artifacts import Artifact, CheckpointArtifact, DatasetArtifact
from schemas.recipe import MeshSpec, ModelSpec, SFTConfig
from stages.core import metrics_logging, storage
from stages.core.datasets import check_dataset, in_memory_stream, load_sft_arrays
from stages.core.errors import InputError
from stages.core.metrics_logging import DEFAULT_SINKS, MetricsSinks
from stages.core.progress import reporting
from stages.core.runner import (
    RunContext,
    StageIdentity,
    StageOutcome,
    optional_input,
    require_input,
    run_stage_on_artifacts,
    stage_identity,
)
from stages.modeling import fast_paths, models, optim, tunix_compat
from stages.modeling.compilations import TRAIN_STEP
from stages.modeling.tokenizers import build_tokenizer
from stages.modeling.training_tail import (
    CARRY_OVER,
    TrainingTail,
    ends,
    replayed_batches,
    session_dirs,
)
from stages.registry import hashed_config

log = logging.getLogger(__name__)
# 2: the loss projects only the loss positions to the vocabulary (tunix_compat
#    .target_positions_loss): the same loss and gradients up to the order of float sums
# 3: those positions' log-probs through the fused projection (stages/modeling/projection):
#    the same loss and gradients up to the order of float sums, faster on CPU
STAGE_VERSION = 3
CURVES = ("loss", "learning_rate")  # the record's history


def batches(arrays: dict[str, np.ndarray], batch_size: int, seed: int) -> grain.MapDataset:
    """A deterministic, endlessly repeating, shuffled batch stream (resume-safe order)."""
    records = [{k: v[i] for k, v in arrays.items()} for i in range(len(arrays["input_tokens"]))]
    if len(records) < batch_size:
        raise InputError(f"sft.batch_size {batch_size} exceeds the {len(records)} SFT rows")
    return replayed_batches(records, batch_size, seed)


def segment_attention_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, L, L]: causal, within one segment, never to padding (segment 0).

    With packed rows this is block-diagonal, so packed examples never see each other.
    """
    length = segment_ids.shape[-1]
    causal = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    real = (segment_ids != 0)[:, None, :]
    return causal[None] & same & real


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """PeftTrainer's input function: per-segment positions and the segment-aware mask."""
    return {
        "input_tokens": batch["input_tokens"],
        "input_mask": batch["input_mask"],
        "positions": batch["positions"],
        "attention_mask": segment_attention_mask(batch["segment_ids"]),
    }


def checkpoint_options(config: SFTConfig) -> ocp.CheckpointManagerOptions:
    """Save every N steps, and also every S seconds when configured; keep the newest
    `keep_checkpoints` (0: all)."""
    policy: Any = ocp.checkpoint_managers.FixedIntervalPolicy(config.checkpoint_every_steps)
    if config.checkpoint_every_seconds is not None:
        timer = ocp.checkpoint_managers.ContinuousCheckpointingPolicy(
            minimum_interval_secs=int(config.checkpoint_every_seconds)
        )
        policy = ocp.checkpoint_managers.AnySavePolicy([policy, timer])
    return ocp.CheckpointManagerOptions(
        save_decision_policy=policy, max_to_keep=config.keep_checkpoints or None
    )


def build_trainer(
    model: Any,
    config: SFTConfig,
    checkpoint_dir: str,
    log_dir: str,
    keep: int,
    sinks: MetricsSinks = DEFAULT_SINKS,
) -> peft_trainer.PeftTrainer:
    """Tunix's PeftTrainer with FAR's inputs and its loss projected at the `keep` loss
    positions a row can hold (tunix_compat.target_positions_loss); its curves go to `sinks`
    (the recipe's logging: backends) and nowhere else."""
    accumulate = config.gradient_accumulation_steps
    training_config = peft_trainer.TrainingConfig(
        eval_every_n_steps=10**9,  # no intermediate eval: it spikes TPU memory mid-training
        max_steps=config.max_steps,
        gradient_accumulation_steps=accumulate if accumulate > 1 else None,
        checkpoint_root_directory=checkpoint_dir,
        checkpointing_options=checkpoint_options(config),
        metrics_logging_options=metrics_logger.MetricsLoggerOptions(
            log_dir=log_dir, flush_every_n_steps=10, backend_kwargs=sinks.tunix_backends(log_dir)
        ),
        pbar_description="SFT",
    )
    optimizer = optim.adamw(
        config.learning_rate,
        config.lr_schedule,
        config.warmup_steps,
        config.max_steps,
        config.weight_decay,
        config.max_grad_norm,
    )
    trainer = peft_trainer.PeftTrainer(model, optimizer, training_config)
    trainer = trainer.with_loss_fn(tunix_compat.target_positions_loss(keep))
    return trainer.with_gen_model_input_fn(model_inputs)


def _train(
    directory: str,
    dataset: DatasetArtifact,
    config: SFTConfig,
    spec: ModelSpec,
    mesh_spec: MeshSpec,
    ctx: RunContext,
    policy: CheckpointArtifact | None,
) -> tuple[CheckpointArtifact, dict[str, float], dict[str, list[float]]]:
    sinks = metrics_logging.for_stage(ctx.metrics_logging, ctx.run, ctx.run_uri, directory)
    tokenizer = build_tokenizer(spec, ctx.model_cache, ctx.shared)
    mesh = models.build_mesh(mesh_spec)
    # full-weight training changes the base network: it gets its own, never the run's shared one
    base = models.base_model(spec, mesh, ctx.model_cache, ctx.shared, private=config.lora is None)
    model = starting_model(base, config, mesh, policy)
    dirs = session_dirs(directory)
    arrays = load_sft_arrays(dataset)
    keep = tunix_compat.loss_positions(arrays["input_mask"])
    trainer = build_trainer(model, config, dirs.local_ckpt, dirs.local_logs, keep, sinks)
    if ctx.progress is not None:  # FAR draws the stage's bar: not Tunix's too
        tunix_compat.hide_progress_bar(trainer)
    tail = TrainingTail.for_trainer(
        "SFT", trainer, dirs, config.max_steps, config.save_margin_seconds
    )
    stream = in_memory_stream(batches(arrays, config.batch_size, config.seed))
    accumulate = config.gradient_accumulation_steps  # a stop falls between windows only
    artifact = tail.run(
        stream,
        ctx,
        mesh,
        spec,
        tokenizer.name,
        config.lora,
        curves=lambda: tail.curves(*CURVES),
        items_per_step=accumulate,
        report=lambda guarded_stream: reporting(
            guarded_stream,
            ctx.progress,
            "sft",
            tail.start_step,
            config.max_steps,
            items_per_step=accumulate,
            metrics=lambda: latest_loss(trainer),
            # a resumed trainer re-reads (and skips) the micro-batches of its first steps
            skip=tail.start_step * accumulate,
        ),
    )
    history, first_step = tail.whole_history(tail.curves(*CURVES))
    metrics = training_metrics(tail, config, arrays, history)
    stage_level = ("tokens_per_second", "useful_token_fraction", "train_step_compilations")
    far_metrics = {f"far/{n}": metrics[n] for n in stage_level}
    sinks.log_once(dirs.local_logs, trainer.train_steps, far_metrics)
    storage.publish_local_directory(dirs.local_logs, dirs.log_uri)
    metrics["full_params_bytes"] = float(models.param_bytes(base))
    metrics["checkpoint_bytes"] = float(artifact.size_bytes)
    metrics["history_from_step"] = float(first_step)
    return artifact, metrics, history


def starting_model(
    base: Any, config: SFTConfig, mesh: Any, policy: CheckpointArtifact | None
) -> Any:
    """Fresh adapters on `base` (or `base` itself, full weights), or the `policy` restored.

    Tunix's trainer then restores this stage's own latest checkpoint over it on a resume.
    """
    if policy is not None:
        return models.restore_policy(policy, base, mesh)
    return models.apply_lora(base, config.lora, mesh, config.seed) if config.lora else base


def check_policy(policy: CheckpointArtifact, config: SFTConfig) -> None:
    """Continuing trains the policy's own parameters: its LoRA spec must be config.lora."""
    if policy.lora != config.lora:
        raise InputError(
            f"sft continues from {policy.uri}, whose LoRA is {policy.lora}, "
            f"but sft.lora is {config.lora}; they must be equal to continue training it"
        )


def latest_loss(trainer: peft_trainer.PeftTrainer) -> dict[str, float]:
    """The last training loss Tunix's metrics logger holds (empty before the first)."""
    logged = trainer.metrics_logger
    if not logged.metric_exists("", "loss", "train"):  # before the first step's metrics
        return {}
    losses = logged.get_metric_history("", "loss", "train")
    return {"loss": float(np.asarray(losses[-1]))} if len(losses) else {}


def training_metrics(
    tail: TrainingTail,
    config: SFTConfig,
    arrays: dict[str, np.ndarray],
    history: dict[str, list[float]],
) -> dict[str, float]:
    """First and final loss and the final learning rate over `history` (every session's
    steps); throughput and compilations of this session's training."""
    first_loss, final_loss = ends(history["loss"])
    rows_per_step = config.batch_size * config.gradient_accumulation_steps
    useful = float((arrays["segment_ids"] > 0).mean())
    trained = tail.clock.times[tail.start_step * config.gradient_accumulation_steps :]
    # throughput after the first batch, whose time is mostly compilation
    seconds = tail.finished - trained[1] if len(trained) > 1 else float("nan")
    tokens = (len(trained) - 1) * config.batch_size * useful * arrays["input_tokens"].shape[1]
    return {
        "first_loss": first_loss,
        "final_loss": final_loss,
        "final_learning_rate": ends(history["learning_rate"])[1],
        "resumed_from_step": float(tail.start_step),
        "steps_this_session": float(config.max_steps - tail.start_step),
        "tokens_per_second": tokens / seconds,
        "useful_token_fraction": useful,
        "rows_per_step": float(rows_per_step),
        "train_step_compilations": float(tail.compiles.count_of(TRAIN_STEP)),
    }


def identity(
    config: SFTConfig,
    model: ModelSpec,
    dataset_fingerprint: str,
    policy_fingerprint: str | None = None,
) -> StageIdentity:
    """The hashed config and inputs; without a policy, exactly the original identity."""
    inputs = {"dataset": dataset_fingerprint}
    if policy_fingerprint is not None:
        inputs["policy"] = policy_fingerprint
    return stage_identity("sft", STAGE_VERSION, hashed_config("sft", config), inputs, model=model)


@fast_paths.scoped("lora_backward")
def train(
    dataset: DatasetArtifact,
    config: SFTConfig,
    model: ModelSpec,
    mesh: MeshSpec,
    ctx: RunContext,
    policy: CheckpointArtifact | None = None,
) -> StageOutcome[CheckpointArtifact]:
    """Train (or reuse, if committed) the SFT checkpoint for `dataset`, from `policy` if given."""
    tokenizer_name = build_tokenizer(model, ctx.model_cache, ctx.shared).name
    check_dataset(dataset, tokenizer_name)
    artifacts: dict[str, Artifact] = {"dataset": dataset}
    if policy is not None:
        models.check_compatible(policy, model, tokenizer_name)
        check_policy(policy, config)
        artifacts["policy"] = policy
    fingerprint = None if policy is None else policy.fingerprint
    return run_stage_on_artifacts(
        ctx,
        identity(config, model, dataset.fingerprint, fingerprint),
        artifacts,
        lambda directory: _train(directory, dataset, config, model, mesh, ctx, policy),
        carry_over=CARRY_OVER,
    )


def run(
    inputs: Mapping[str, Artifact], config: SFTConfig, ctx: RunContext
) -> StageOutcome[CheckpointArtifact]:
    """The registered entry point (stages/registry.py): `dataset`, and `policy` to continue."""
    return train(
        require_input(inputs, "dataset", DatasetArtifact),
        config,
        ctx.require_model(),
        ctx.mesh,
        ctx,
        policy=optional_input(inputs, "policy", CheckpointArtifact),
    )
