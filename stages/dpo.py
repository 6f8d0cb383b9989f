"""DPO / ORPO stage: preference optimisation of a checkpoint with Tunix's DPOTrainer.

Entry point: `optimize(policy, preferences, config, model, mesh, ctx)` ->
StageOutcome[CheckpointArtifact].

The policy starts from its checkpoint (LoRA adapters or full weights); for DPO a second,
frozen copy of the same checkpoint is the reference model, ORPO needs none (Tunix's
DPOTrainer does both: `algorithm` dpo or orpo). Pairs are tokenized here (prompt left-padded
with BOS, responses right-padded with EOS, truncated to `max_response_len`) and fed as
Tunix's tokenized TrainingInput, in a seeded order that a resumed run replays: DPOTrainer is
a PeftTrainer, so it restores its own checkpoints (params, optimizer, step) and skips the
batches already trained on. It stops and saves before the deadline, like SFT.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import optax
import orbax.checkpoint as ocp
from tunix.sft import metrics_logger
from tunix.sft.dpo import dpo_trainer

from schemas.artifacts import Artifact, CheckpointArtifact, PreferenceDataset
from schemas.recipe import DPOConfig, MeshSpec, ModelSpec
from stages.core import metrics_logging, storage
from stages.core.datasets import in_memory_stream
from stages.core.errors import InputError, MissingInput
from stages.core.metrics_logging import DEFAULT_SINKS, MetricsSinks
from stages.core.records import find_record
from stages.core.runner import (
    RunContext,
    StageIdentity,
    StageOutcome,
    require_input,
    run_stage_on_artifacts,
    stage_identity,
)
from stages.modeling import fast_paths, models, preference_loss
from stages.modeling.tokenizers import Tokenizer, build_tokenizer
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


def _pad(ids: list[int], length: int, pad: int, left: bool) -> tuple[np.ndarray, np.ndarray]:
    ids = ids[-length:] if left else ids[:length]
    fill = [pad] * (length - len(ids))
    mask = [0] * len(fill)
    tokens = fill + ids if left else ids + fill
    real = mask + [1] * len(ids) if left else [1] * len(ids) + mask
    return np.asarray(tokens, np.int32), np.asarray(real, np.int32)


def tokenize_pairs(
    pairs: list[dict[str, Any]], tokenizer: Tokenizer, response_len: int
) -> list[dict[str, np.ndarray]]:
    """Tunix TrainingInput fields per pair: prompt left-padded, responses right-padded."""
    prompts = [[tokenizer.bos_id(), *tokenizer.encode(p["prompt"])] for p in pairs]
    prompt_len = max(len(p) for p in prompts)
    pad = tokenizer.pad_id()
    out = []
    for pair, prompt in zip(pairs, prompts, strict=True):
        record = {}
        record["prompt_ids"], record["prompt_mask"] = _pad(prompt, prompt_len, pad, left=True)
        for side in ("chosen", "rejected"):
            ids = [*tokenizer.encode(pair[side]), tokenizer.eos_id()]
            record[f"{side}_ids"], record[f"{side}_mask"] = _pad(ids, response_len, pad, False)
        out.append(record)
    return out


def batches(records: list[dict[str, np.ndarray]], batch_size: int, seed: int) -> Any:
    """A seeded, endlessly repeating batch order (a resumed run replays it and skips)."""
    if len(records) < batch_size:
        raise InputError(
            f"dpo.batch_size {batch_size} exceeds the {len(records)} preference pairs; "
            f"expected batch_size <= {len(records)} (or more pairs)"
        )
    return replayed_batches(records, batch_size, seed)


def build_trainer(
    network: Any,
    reference: Any,
    config: DPOConfig,
    ckpt_dir: str,
    log_dir: str,
    sinks: MetricsSinks = DEFAULT_SINKS,
) -> dpo_trainer.DPOTrainer:
    training = dpo_trainer.DPOTrainingConfig(
        algorithm=config.algorithm,
        beta=config.beta,
        lambda_orpo=config.lambda_orpo,
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
        pbar_description=config.algorithm.upper(),
    )
    optimizer = optax.adamw(config.learning_rate)
    trainer = dpo_trainer.DPOTrainer(network, reference, optimizer, training)
    if config.logprobs == "mean":  # FAR's loss on per-token averaged log-probs
        trainer.with_loss_fn(preference_loss.averaged_loss_fn, has_aux=True)
    return trainer


def _optimize(
    directory: str,
    policy: CheckpointArtifact,
    preferences: PreferenceDataset,
    config: DPOConfig,
    spec: ModelSpec,
    mesh_spec: MeshSpec,
    ctx: RunContext,
) -> tuple[CheckpointArtifact, dict[str, float], dict[str, list[float]]]:
    sinks = metrics_logging.for_stage(ctx.metrics_logging, ctx.run, ctx.run_uri, directory)
    tokenizer = build_tokenizer(spec, ctx.model_cache, ctx.shared)
    mesh = models.build_mesh(mesh_spec)
    text = storage.read_text(preferences.uri)
    pairs = [json.loads(line) for line in text.splitlines() if line.strip()]
    records = tokenize_pairs(pairs, tokenizer, config.max_response_len)
    # a full-weight policy is restored into (and trains) its base network: a private one
    base = models.base_model(spec, mesh, ctx.model_cache, ctx.shared, private=policy.lora is None)
    network = models.restore_policy(policy, base, mesh)
    reference = None
    if config.algorithm == "dpo":  # a frozen copy of the starting policy
        reference = models.policy_network(policy, mesh, ctx.model_cache, ctx.shared, base)
    dirs = session_dirs(directory)
    trainer = build_trainer(network, reference, config, dirs.local_ckpt, dirs.local_logs, sinks)
    tail = TrainingTail.for_trainer(
        config.algorithm, trainer, dirs, config.max_steps, config.save_margin_seconds
    )
    stream = in_memory_stream(batches(records, config.batch_size, config.seed))
    curves = lambda: _history(tail)  # noqa: E731
    artifact = tail.run(stream, ctx, mesh, spec, tokenizer.name, policy.lora, curves=curves)
    history, first_step = tail.whole_history(curves())
    metrics = {**_metrics(tail, len(pairs), history), "history_from_step": float(first_step)}
    return artifact, metrics, history


def _history(tail: TrainingTail) -> dict[str, list[float]]:
    curves = tail.curves("loss", "rewards/margin", "rewards/accuracy")
    return {name: values for name, values in curves.items() if values}  # those logged


def _metrics(tail: TrainingTail, pairs: int, history: dict[str, list[float]]) -> dict[str, float]:
    """The first and final value of each curve over `history` (every session's steps)."""
    metrics = {"pairs": float(pairs), "resumed_from_step": float(tail.start_step)}
    for name, values in history.items():
        metrics[f"first_{name}"], metrics[f"final_{name}"] = ends(values)
    return metrics


def identity(
    config: DPOConfig, model: ModelSpec, policy_fingerprint: str, pairs_fingerprint: str
) -> StageIdentity:
    inputs = {"policy": policy_fingerprint, "preferences": pairs_fingerprint}
    return stage_identity("dpo", STAGE_VERSION, hashed_config("dpo", config), inputs, model=model)


@fast_paths.scoped("lora_backward")
def optimize(
    policy: CheckpointArtifact,
    preferences: PreferenceDataset,
    config: DPOConfig,
    model: ModelSpec,
    mesh: MeshSpec,
    ctx: RunContext,
) -> StageOutcome[CheckpointArtifact]:
    """Train `policy` on `preferences` with DPO or ORPO (or reuse the committed result)."""
    models.check_compatible(policy, model, build_tokenizer(model, ctx.model_cache, ctx.shared).name)
    if find_record(preferences.uri, levels=2) is None:
        raise MissingInput(
            f"preference pairs {preferences.uri} are not committed (no stage record); "
            f"expected the output of a preferences node"
        )
    return run_stage_on_artifacts(
        ctx,
        identity(config, model, policy.fingerprint, preferences.fingerprint),
        {"policy": policy, "preferences": preferences},
        lambda directory: _optimize(directory, policy, preferences, config, model, mesh, ctx),
        carry_over=CARRY_OVER,
    )


def run(
    inputs: Mapping[str, Artifact], config: DPOConfig, ctx: RunContext
) -> StageOutcome[CheckpointArtifact]:
    """The registered entry point (stages/registry.py): the `policy` and its `preferences`."""
    policy = require_input(inputs, "policy", CheckpointArtifact)
    pairs = require_input(inputs, "preferences", PreferenceDataset)
    return optimize(policy, pairs, config, ctx.require_model(), ctx.mesh, ctx)
