"""GRPO-reinforce stage: reward correctness and format with Tunix's GRPOLearner.

Entry point: `reinforce(dataset, sft, config, model, mesh, ctx)` ->
StageOutcome[CheckpointArtifact].

The policy starts from the SFT CheckpointArtifact (restored from its URI); the LoRA-free base
network is the frozen reference for the KL term. Rollouts use Tunix's vanilla engine on the
same mesh. Actor checkpoints are written by Tunix under checkpoints/actor/.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import optax
import orbax.checkpoint as ocp
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout

from schemas.artifacts import CheckpointArtifact, DatasetArtifact
from schemas.recipe import GRPOConfig, MeshSpec, ModelSpec
from stages import models, rewards, storage
from stages.data_prep import load_prompts
from stages.runner import (
    RunContext,
    SessionExpired,
    StageIdentity,
    StageOutcome,
    run_stage,
    with_uris,
)
from stages.sessions import StepClock, guarded
from stages.sft import check_dataset
from stages.tokenizers import build_tokenizer

log = logging.getLogger(__name__)
STAGE_VERSION = 1
CHECKPOINT_DIR = "checkpoints"
ACTOR_SUBDIR = "actor"  # where Tunix's RLCluster puts the trained policy's checkpoints


def prompt_batches(
    rows: list[dict[str, str]], batch_size: int, seed: int
) -> Iterator[dict[str, Any]]:
    """Endless deterministic epochs of {'prompts', 'answer'} batches (numpy, as Tunix needs)."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(rows))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            chosen = [rows[i] for i in order[start : start + batch_size]]
            yield {
                "prompts": np.asarray([r["prompt"] for r in chosen]),
                "answer": np.asarray([r["answer"] for r in chosen]),
                "tests": np.asarray([json.dumps(r.get("tests", [])) for r in chosen]),
            }


def _cluster_config(
    config: GRPOConfig, prompt_len: int, ckpt_dir: str, mesh: Any, eos: list[int]
) -> rl_cluster_lib.ClusterConfig:
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.adamw(config.learning_rate),
        eval_every_n_steps=10**9,
        max_steps=config.max_steps,
        mini_batch_size=config.batch_size,
        train_micro_batch_size=config.train_micro_batch_size,
        checkpoint_root_directory=ckpt_dir,
        checkpointing_options=ocp.CheckpointManagerOptions(
            save_interval_steps=config.checkpoint_every_steps, max_to_keep=2
        ),
        pbar_description="GRPO",
    )
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=config.max_generation_tokens,
        max_prompt_length=prompt_len,
        kv_cache_size=prompt_len + config.max_generation_tokens + 8,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        eos_tokens=eos,
        seed=config.seed,
    )
    roles = (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE, rl_cluster_lib.Role.ROLLOUT)
    return rl_cluster_lib.ClusterConfig(
        role_to_mesh={role: mesh for role in roles},
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=training,
        rollout_config=rollout,
    )


def _learner(
    cluster: rl_cluster_lib.RLCluster, config: GRPOConfig, sandbox: rewards.SandboxStats
) -> grpo_learner.GRPOLearner:
    algo = grpo_learner.GRPOConfig(
        num_generations=config.num_generations, num_iterations=config.num_iterations,
        beta=config.beta, epsilon=config.epsilon, loss_algo=config.loss_variant,
    )  # fmt: skip
    return grpo_learner.GRPOLearner(
        rl_cluster=cluster, algo_config=algo,
        reward_fns=rewards.tunix_reward_fns(config.rewards, sandbox),
    )  # fmt: skip


def resync_after_restore(cluster: rl_cluster_lib.RLCluster, step: int) -> None:
    """Work around two Tunix 0.1.7 resume defects (FIELD-NOTES): the rollout and anchor
    weights still hold the pre-restore policy until the first sync, and the global step
    restarts at 0 when the last checkpoint was written by close() (empty custom metadata)."""
    cluster.sync_weights()  # pushes the restored adapters; also bumps global_steps
    cluster.global_steps = step


def _reinforce(
    directory: str, dataset: DatasetArtifact, sft: CheckpointArtifact, config: GRPOConfig,
    spec: ModelSpec, mesh_spec: MeshSpec, ctx: RunContext,
) -> tuple[CheckpointArtifact, dict[str, float], dict[str, list[float]]]:  # fmt: skip
    tokenizer = build_tokenizer(spec, ctx.model_cache)
    mesh = models.build_mesh(mesh_spec)
    reference = models.build_base_model(spec, mesh, ctx.model_cache)
    actor = models.restore_policy(sft, reference, mesh)
    ckpt_uri = storage.join(directory, CHECKPOINT_DIR)
    local_ckpt = storage.orbax_directory(ckpt_uri)
    eos = [tokenizer.eos_id(), tokenizer.end_of_turn_id()]
    cluster = rl_cluster_lib.RLCluster(
        actor=actor, reference=reference, tokenizer=tokenizer,
        cluster_config=_cluster_config(config, dataset.prompt_len, local_ckpt, mesh, eos),
    )  # fmt: skip
    sandbox, history = rewards.SandboxStats(), MetricsHistory()
    learner = _learner(cluster, config, sandbox)
    cluster.with_external_metrics_logger(history)
    # A restored actor resumes at its step: skip the prompt batches it already trained on
    # (one batch per step), so the run continues at the exact prompt position.
    start_step = cluster.actor_trainer.train_steps
    if start_step:
        resync_after_restore(cluster, start_step)
    rows = load_prompts(dataset, "grpo_train")
    batches = itertools.islice(prompt_batches(rows, config.batch_size, config.seed), start_step,
                               None)  # fmt: skip
    stream = guarded(batches, ctx.deadline, ctx.stop, config.save_margin_seconds, StepClock())
    with mesh:
        learner.train(stream)  # ends with the cluster's close(): saves the last checkpoint
    storage.publish_tree(local_ckpt, ckpt_uri)
    done = cluster.actor_trainer.train_steps
    if done < config.max_steps:
        raise SessionExpired(f"GRPO stopped at step {done} of {config.max_steps} with a "
                             f"checkpoint saved; it resumes from there")  # fmt: skip
    actor_uri = storage.join(ckpt_uri, ACTOR_SUBDIR)
    artifact = CheckpointArtifact(
        uri=actor_uri, step=config.max_steps, model=spec, tokenizer=tokenizer.name,
        lora=sft.lora, size_bytes=sum(storage.list_files(actor_uri).values()),
        fingerprint=storage.tree_fingerprint(actor_uri),
    )  # fmt: skip
    metrics = {
        **history.summary(),
        "resumed_from_step": float(start_step),
        "sandbox_runs": float(sandbox.runs),
        "sandbox_failures": float(sandbox.failures),
    }
    return artifact, metrics, history.curves()


class MetricsHistory:
    """Collects Tunix's per-step numeric RL metrics through its public external-logger hook."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def __call__(self, buffer: Any) -> None:
        for name, (value, op) in buffer.metrics.items():
            array = np.asarray(value)
            if array.dtype.kind not in "biuf" or array.size == 0:
                continue  # text samples (prompts, completions) are not metrics
            scalar = op(array) if op is not None else array.mean()
            self.values.setdefault(name, []).append(float(scalar))

    def curves(self) -> dict[str, list[float]]:
        """Per-step reward means and KL (the training curves the report plots)."""
        wanted = [n for n in self.values if n.startswith("rewards/") or "kl" in n.lower()]
        return {name: self.values[name] for name in sorted(wanted)}

    def summary(self) -> dict[str, float]:
        """First and last value of every reward metric, and the step count seen."""
        out: dict[str, float] = {}
        for name, history in sorted(self.values.items()):
            if name.startswith("rewards/"):
                out[f"{name}/first"], out[f"{name}/last"] = history[0], history[-1]
        return out


def identity(
    config: GRPOConfig, model: ModelSpec, dataset_fingerprint: str, sft_fingerprint: str
) -> StageIdentity:
    hashed = {"grpo": config.model_dump(mode="json"), "model": model.model_dump(mode="json")}
    inputs = {"dataset": dataset_fingerprint, "sft": sft_fingerprint}
    return StageIdentity("grpo", STAGE_VERSION, hashed, inputs)


def reinforce(
    dataset: DatasetArtifact,
    sft: CheckpointArtifact,
    config: GRPOConfig,
    model: ModelSpec,
    mesh: MeshSpec,
    ctx: RunContext,
) -> StageOutcome[CheckpointArtifact]:
    """Run GRPO from the SFT checkpoint (or reuse a committed result)."""
    tokenizer_name = build_tokenizer(model, ctx.model_cache).name
    check_dataset(dataset, tokenizer_name)
    models.check_compatible(sft, model, tokenizer_name)
    rewards.validate_names(config.rewards)
    return run_stage(
        ctx,
        with_uris(identity(config, model, dataset.fingerprint, sft.fingerprint),
                  dataset=dataset.uri, sft=sft.uri),
        lambda directory: _reinforce(directory, dataset, sft, config, model, mesh, ctx),
        carry_over=(CHECKPOINT_DIR,),
    )  # fmt: skip
