"""Distillation stage: a student learns from a teacher checkpoint, through Tunix's
DistillationTrainer with its logit strategy.

Entry point: `distill(dataset, teacher, config, model, mesh, ctx)` ->
StageOutcome[CheckpointArtifact].

The teacher is restored from its checkpoint (its own ModelSpec); the student is built from
`config.student` (default: the recipe's model), may be smaller, and must use the same
tokenizer. On the dataset's SFT rows the student minimises alpha x KL(teacher || student) at
`temperature` plus (1 - alpha) x the next-token cross-entropy, over every real token of a row.
DistillationTrainer is a PeftTrainer: checkpoints (student params, optimizer, step) are
restored on a re-run and the seeded batch order replayed, and it stops and saves before the
deadline like SFT. The output checkpoint's `model` is the student's spec.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from tunix.distillation import distillation_trainer
from tunix.distillation.strategies import logit
from tunix.sft import metrics_logger
from tunix.sft import utils as sft_utils

from schemas.artifacts import Artifact, CheckpointArtifact, DatasetArtifact
from schemas.recipe import DistillConfig, MeshSpec, ModelSpec
from stages.core import metrics_logging
from stages.core.datasets import check_dataset, in_memory_stream, load_sft_arrays
from stages.core.errors import InputError
from stages.core.metrics_logging import DEFAULT_SINKS, MetricsSinks
from stages.core.runner import (
    RunContext,
    StageIdentity,
    StageOutcome,
    require_input,
    run_stage_on_artifacts,
    stage_identity,
)
from stages.modeling import fast_paths, models
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
STAGE_VERSION = 1


def logits(model: Any, input_tokens: jax.Array, input_mask: jax.Array) -> jax.Array:
    """Next-token logits for positions 0..L-2 (causal, padding masked out)."""
    positions = sft_utils.build_positions_from_mask(input_mask)
    attention = sft_utils.make_causal_attn_mask(input_mask)
    out, _ = model(input_tokens, positions, None, attention)
    return out[:, :-1, :]


def make_labels(vocab: int) -> Any:
    def labels(input_tokens: jax.Array, input_mask: jax.Array) -> jax.Array:
        """One-hot next tokens, zero where the next token is padding."""
        targets = jax.nn.one_hot(input_tokens[:, 1:], vocab)
        return targets * input_mask[:, 1:, None]

    return labels


def batches(arrays: dict[str, np.ndarray], batch_size: int, seed: int) -> Any:
    """Seeded, repeating batches of Tunix TrainingInput (tokens, real-token mask)."""
    records = [
        {"input_tokens": t, "input_mask": (s > 0).astype(np.int32)}
        for t, s in zip(arrays["input_tokens"], arrays["segment_ids"], strict=True)
    ]
    if len(records) < batch_size:
        raise InputError(
            f"distill.batch_size {batch_size} exceeds the {len(records)} SFT rows; expected "
            f"batch_size <= {len(records)} (or a larger data.sft.size)"
        )
    return replayed_batches(records, batch_size, seed).map(
        lambda b: distillation_trainer.TrainingInput(**b)
    )


def build_trainer(
    student: Any,
    teacher: Any,
    config: DistillConfig,
    vocab: int,
    ckpt_dir: str,
    log_dir: str,
    sinks: MetricsSinks = DEFAULT_SINKS,
) -> distillation_trainer.DistillationTrainer:
    strategy = logit.LogitStrategy(
        student_forward_fn=logits,
        teacher_forward_fn=logits,
        labels_fn=make_labels(vocab),
        temperature=config.temperature,
        alpha=config.alpha,
    )
    training = distillation_trainer.TrainingConfig(
        eval_every_n_steps=10**9,
        max_steps=config.max_steps,
        checkpoint_root_directory=ckpt_dir,
        checkpointing_options=ocp.CheckpointManagerOptions(
            save_interval_steps=config.checkpoint_every_steps,
            max_to_keep=config.keep_checkpoints or None,
        ),
        metrics_logging_options=metrics_logger.MetricsLoggerOptions(
            log_dir=log_dir, flush_every_n_steps=10, backend_kwargs=sinks.tunix_backends(log_dir)
        ),
        pbar_description="distill",
    )
    optimizer = optax.adamw(config.learning_rate)
    return distillation_trainer.DistillationTrainer(student, teacher, strategy, optimizer, training)


def _distill(
    directory: str,
    dataset: DatasetArtifact,
    teacher: CheckpointArtifact,
    config: DistillConfig,
    student_spec: ModelSpec,
    mesh_spec: MeshSpec,
    ctx: RunContext,
) -> tuple[CheckpointArtifact, dict[str, float], dict[str, list[float]]]:
    sinks = metrics_logging.for_stage(ctx.metrics_logging, ctx.run, ctx.run_uri, directory)
    mesh = models.build_mesh(mesh_spec)
    teacher_net = models.policy_network(teacher, mesh, ctx.model_cache, ctx.shared)
    private = config.lora is None  # full-weight training changes its base network
    base = models.base_model(student_spec, mesh, ctx.model_cache, ctx.shared, private=private)
    student = models.apply_lora(base, config.lora, mesh, config.seed) if config.lora else base
    vocab = models.tunix_config(student_spec).num_embed
    dirs = session_dirs(directory)
    trainer = build_trainer(
        student, teacher_net, config, vocab, dirs.local_ckpt, dirs.local_logs, sinks
    )
    tail = TrainingTail.for_trainer(
        "distill", trainer, dirs, config.max_steps, config.save_margin_seconds
    )
    stream = in_memory_stream(batches(load_sft_arrays(dataset), config.batch_size, config.seed))
    curves = lambda: tail.curves("loss")  # noqa: E731
    artifact = tail.run(
        stream, ctx, mesh, student_spec, teacher.tokenizer, config.lora, curves=curves
    )
    history, first_step = tail.whole_history(curves())
    first_loss, final_loss = ends(history["loss"])  # over every session's steps
    metrics = {
        "first_loss": first_loss,
        "final_loss": final_loss,
        "resumed_from_step": float(tail.start_step),
        "student_params_bytes": float(models.param_bytes(base)),
        "history_from_step": float(first_step),
    }
    return artifact, metrics, history


def identity(
    config: DistillConfig, student: ModelSpec, dataset_fingerprint: str, teacher_fingerprint: str
) -> StageIdentity:
    inputs = {"dataset": dataset_fingerprint, "teacher": teacher_fingerprint}
    hashed = hashed_config("distill", config)
    return stage_identity("distill", STAGE_VERSION, hashed, inputs, model=student)


@fast_paths.scoped("lora_backward")
def distill(
    dataset: DatasetArtifact,
    teacher: CheckpointArtifact,
    config: DistillConfig,
    model: ModelSpec,
    mesh: MeshSpec,
    ctx: RunContext,
) -> StageOutcome[CheckpointArtifact]:
    """Train a student (config.student, default `model`) on `teacher`'s logits over `dataset`."""
    student = config.student or model
    tokenizer_name = build_tokenizer(student, ctx.model_cache, ctx.shared).name
    check_dataset(dataset, tokenizer_name)
    models.check_compatible(teacher, teacher.model, tokenizer_name)
    vocab, teacher_vocab = (models.tunix_config(m).num_embed for m in (student, teacher.model))
    if vocab != teacher_vocab:
        raise InputError(
            f"distill: the student's vocabulary ({vocab} embeddings) must equal the "
            f"teacher's ({teacher_vocab}): the KL compares their logits token by token"
        )
    return run_stage_on_artifacts(
        ctx,
        identity(config, student, dataset.fingerprint, teacher.fingerprint),
        {"dataset": dataset, "teacher": teacher},
        lambda directory: _distill(directory, dataset, teacher, config, student, mesh, ctx),
        carry_over=CARRY_OVER,
    )


def run(
    inputs: Mapping[str, Artifact], config: DistillConfig, ctx: RunContext
) -> StageOutcome[CheckpointArtifact]:
    """The registered entry point (stages/registry.py): `dataset` and the `teacher`."""
    dataset = require_input(inputs, "dataset", DatasetArtifact)
    teacher = require_input(inputs, "teacher", CheckpointArtifact)
    return distill(dataset, teacher, config, ctx.require_model(), ctx.mesh, ctx)
