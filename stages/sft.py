"""SFT-format stage: teach the <reasoning>/<answer> format with Tunix PeftTrainer.

Entry point: `train(dataset, config, model, mesh, ctx) -> StageOutcome[CheckpointArtifact]`.

The model is built from the recipe's ModelSpec, qwix LoRA is applied (or full weights are
trained), and PeftTrainer trains on the loss mask from data-prep. Orbax checkpoints go to the
stage directory's checkpoints/; PeftTrainer restores them itself, so a re-run after a crash
continues from the latest committed step (the grain pipeline is deterministic, so the batches
it skips are exactly the ones already trained on).
"""

from __future__ import annotations

import logging
from typing import Any

import grain
import numpy as np
import optax
import orbax.checkpoint as ocp
from tunix.sft import peft_trainer
from tunix.sft import utils as sft_utils

from schemas.artifacts import CheckpointArtifact, DatasetArtifact
from schemas.recipe import MeshSpec, ModelSpec, SFTConfig
from stages import models, storage
from stages.data_prep import load_sft_arrays
from stages.runner import RunContext, StageIdentity, StageOutcome, run_stage
from stages.tokenizers import build_tokenizer

log = logging.getLogger(__name__)
STAGE_VERSION = 1
CHECKPOINT_DIR = "checkpoints"


def check_dataset(dataset: DatasetArtifact, tokenizer_name: str) -> None:
    """Refuse data that is missing, uncommitted or tokenized for another model, before compute."""
    record_uri = storage.join(dataset.uri, "stage.json")
    if not storage.exists(record_uri):
        raise FileNotFoundError(
            f"dataset {dataset.uri} is not a committed data_prep output (no {record_uri})"
        )
    if dataset.tokenizer != tokenizer_name:
        raise ValueError(
            f"dataset {dataset.uri} was tokenized with {dataset.tokenizer!r}, "
            f"the model uses {tokenizer_name!r}"
        )


def batches(arrays: dict[str, np.ndarray], batch_size: int, seed: int) -> grain.MapDataset:
    """A deterministic, endlessly repeating, shuffled batch stream (resume-safe order)."""
    records = [{k: v[i] for k, v in arrays.items()} for i in range(len(arrays["input_tokens"]))]
    if len(records) < batch_size:
        raise ValueError(f"sft.batch_size {batch_size} exceeds the {len(records)} SFT examples")
    return (
        grain.MapDataset.source(records)
        .seed(seed)
        .shuffle()
        .repeat()
        .batch(batch_size, drop_remainder=True)
    )


def model_inputs(pad_id: int) -> Any:
    """PeftTrainer's input function: positions and a causal mask that ignores padding."""

    def gen(batch: dict[str, Any]) -> dict[str, Any]:
        tokens = batch["input_tokens"]
        not_pad = tokens != pad_id
        return {
            "input_tokens": tokens,
            "input_mask": batch["input_mask"],
            "positions": sft_utils.build_positions_from_mask(not_pad),
            "attention_mask": sft_utils.make_causal_attn_mask(not_pad),
        }

    return gen


def _train(
    directory: str,
    dataset: DatasetArtifact,
    config: SFTConfig,
    spec: ModelSpec,
    mesh_spec: MeshSpec,
    cache_dir: str,
) -> tuple[CheckpointArtifact, dict[str, float]]:
    tokenizer = build_tokenizer(spec, cache_dir)
    mesh = models.build_mesh(mesh_spec)
    base = models.build_base_model(spec, mesh, cache_dir)
    model = models.apply_lora(base, config.lora, mesh, config.seed) if config.lora else base
    ckpt_uri = storage.join(directory, CHECKPOINT_DIR)
    training_config = peft_trainer.TrainingConfig(
        eval_every_n_steps=10**9,  # no intermediate eval (seed 000: it crashed at step 80)
        max_steps=config.max_steps,
        gradient_accumulation_steps=(
            config.gradient_accumulation_steps if config.gradient_accumulation_steps > 1 else None
        ),
        checkpoint_root_directory=storage.orbax_directory(ckpt_uri),
        checkpointing_options=ocp.CheckpointManagerOptions(
            save_interval_steps=config.checkpoint_every_steps, max_to_keep=2
        ),
        pbar_description="SFT",
    )
    trainer = peft_trainer.PeftTrainer(model, optax.adamw(config.learning_rate), training_config)
    trainer = trainer.with_gen_model_input_fn(model_inputs(tokenizer.pad_id()))
    data = batches(load_sft_arrays(dataset), config.batch_size, config.seed)
    with mesh:
        trainer.train(iter(data))
    losses = trainer.metrics_logger.get_metric_history("", "loss", "train")
    trainer.close()
    storage.publish_tree(storage.orbax_directory(ckpt_uri), ckpt_uri)
    artifact = CheckpointArtifact(
        uri=ckpt_uri,
        step=config.max_steps,
        model=spec,
        tokenizer=tokenizer.name,
        lora=config.lora,
        size_bytes=sum(storage.list_files(ckpt_uri).values()),
        fingerprint=storage.tree_fingerprint(ckpt_uri),
    )
    metrics = {
        "final_loss": float(np.asarray(losses)[-1]),
        "first_loss": float(np.asarray(losses)[0]),
    }
    return artifact, metrics


def identity(config: SFTConfig, model: ModelSpec, dataset_fingerprint: str) -> StageIdentity:
    hashed = {"sft": config.model_dump(mode="json"), "model": model.model_dump(mode="json")}
    return StageIdentity("sft", STAGE_VERSION, hashed, {"dataset": dataset_fingerprint})


def train(
    dataset: DatasetArtifact, config: SFTConfig, model: ModelSpec, mesh: MeshSpec, ctx: RunContext
) -> StageOutcome[CheckpointArtifact]:
    """Train (or reuse, if committed) the SFT checkpoint for `dataset`."""
    check_dataset(dataset, build_tokenizer(model, ctx.model_cache).name)
    return run_stage(
        ctx,
        identity(config, model, dataset.fingerprint),
        lambda directory: _train(directory, dataset, config, model, mesh, ctx.model_cache),
    )
