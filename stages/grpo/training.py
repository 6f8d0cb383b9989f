"""The GRPO stage: reward correctness and format with Tunix's GRPOLearner.

Entry point: `reinforce(dataset, sft, config, model, mesh, ctx)` ->
StageOutcome[CheckpointArtifact].

The policy starts from the SFT CheckpointArtifact (restored from its URI); a second, frozen
restore of it is the reference for the KL term. Rollouts use Tunix's vanilla engine on the
same mesh, sampling with a seed derived from the recipe seed and the global step
(stages/grpo/rollouts.py). Actor checkpoints are written by Tunix under checkpoints/actor/, per-step
metrics to tensorboard/ and the record's history, a few completions per step to samples.jsonl.

`max_steps` and `checkpoint_every_steps` count GRPO steps (prompt batches); Tunix counts
optimizer updates, num_iterations per step, so both are scaled for it. A resumed run skips
exactly the prompt batches already trained on and samples with the same seeds, so stopping
and resuming (or kill -9 and re-running) ends with the same adapters, bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orbax.checkpoint as ocp
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import dapo_learner, drgrpo_learner, grpo_learner
from tunix.rl.rollout import base_rollout
from tunix.sft import metrics_logger

from schemas.artifacts import Artifact, CheckpointArtifact, DatasetArtifact
from schemas.recipe import AnswerFormat, GRPOConfig, MeshSpec, ModelSpec
from stages import rewards
from stages.core import metrics_logging, storage
from stages.core.checkpoints import train_curve
from stages.core.datasets import check_dataset, load_prompts
from stages.core.errors import InputError
from stages.core.metrics_logging import DEFAULT_SINKS, MetricsSinks
from stages.core.progress import report_end, reporting
from stages.core.runner import (
    RunContext,
    StageIdentity,
    StageOutcome,
    require_input,
    run_stage_on_artifacts,
    stage_identity,
)
from stages.core.sessions import nonempty
from stages.grpo import advantages, metrics, reward_sums, rollouts, timing
from stages.grpo import baseline as greedy_baseline
from stages.modeling import fast_paths, models, optim, training_tail, tunix_api, tunix_compat
from stages.modeling.compilations import (
    SAMPLER_FUNCTIONS,
    TRAIN_STEP,
    CompileCounter,
)
from stages.modeling.tokenizers import build_tokenizer
from stages.registry import hashed_config

log = logging.getLogger(__name__)
# 2: per-step rollout seeds, exact resume position, TensorBoard, samples
# 3: the optimizer from the recipe (schedule, clipping, weight decay, betas); algorithms
# 4: the KL reference is the starting policy (a frozen restore of it), not the LoRA-free base
# 5: log-probs through the fused projection (stages/modeling/projection): equal to float
#    rounding (the order of sums), faster on CPU
# 6: format_strict (reward and format-rate metric) wants each tag once and nothing after the
#    answer but the end-of-turn marker (version 5 paid for trailing junk after </answer>)
STAGE_VERSION = 6
SAMPLES_FILE = "samples.jsonl"
ACTOR_SUBDIR = "actor"  # where Tunix's RLCluster puts the trained policy's checkpoints


def prompt_batches(
    rows: list[dict[str, str]], batch_size: int, seed: int
) -> Iterator[dict[str, Any]]:
    """Endless deterministic epochs of {'prompts', 'answer', 'tests', 'columns'} batches
    (numpy, as Tunix needs)."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(rows))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            chosen = [rows[i] for i in order[start : start + batch_size]]
            yield {
                "prompts": np.asarray([r["prompt"] for r in chosen]),
                "answer": np.asarray([r["answer"] for r in chosen]),
                "tests": np.asarray([json.dumps(r.get("tests", [])) for r in chosen]),
                # the row's own columns, for a user's reward (stages/rewards `references`)
                "columns": np.asarray([json.dumps(r.get("columns", {})) for r in chosen]),
            }


def _cluster_config(
    config: GRPOConfig,
    prompt_len: int,
    ckpt_dir: str,
    log_dir: str,
    meshes: tuple[Any, Any],
    eos: list[int],
    sinks: MetricsSinks = DEFAULT_SINKS,
) -> rl_cluster_lib.ClusterConfig:
    """`meshes`: (actor and reference mesh, rollout mesh); one mesh shares the weights."""
    updates = config.num_iterations  # optimizer updates per GRPO step (per prompt batch)
    step_prompts = rolled_out(config)
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optim.grpo_adamw(config),
        eval_every_n_steps=10**9,
        max_steps=config.max_steps * updates,
        mini_batch_size=step_prompts,  # one optimizer update a step
        # oversample: the step's one example, cut to batch_size groups before the update
        train_micro_batch_size=step_prompts
        if config.oversample > 1
        else config.train_micro_batch_size,
        # Tunix would roll out micro-batch by micro-batch too: one rollout of the step's
        # prompts keeps decode's rows (its lever: it is memory-bound) whatever the backward's.
        rollout_micro_batch_size=step_prompts,
        checkpoint_root_directory=ckpt_dir,
        checkpointing_options=ocp.CheckpointManagerOptions(
            save_interval_steps=config.checkpoint_every_steps * updates,
            max_to_keep=config.keep_checkpoints or None,
        ),
        metrics_logging_options=metrics_logger.MetricsLoggerOptions(
            log_dir=log_dir, flush_every_n_steps=1, backend_kwargs=sinks.tunix_backends(log_dir)
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
        seed=None if meshes[0] is meshes[1] else config.seed,  # SeededRollout: one per step
    )
    # SeededRollout samples with the actor's own model (RLCluster hands custom engines the
    # actor); a rollout apart from the actor needs Tunix's engine, which copies the weights.
    engine: Any = functools.partial(
        tunix_compat.SeededRollout,
        seed_of=functools.partial(rollouts.step_seed, config.seed),
        draw=config.draw,
        prompt_group=config.num_generations if config.share_prompts else 1,
        projection=config.sampler_projection,
    )
    role = rl_cluster_lib.Role
    return rl_cluster_lib.ClusterConfig(
        role_to_mesh={role.ACTOR: meshes[0], role.REFERENCE: meshes[0], role.ROLLOUT: meshes[1]},
        rollout_engine=engine if meshes[0] is meshes[1] else "vanilla",
        offload_to_cpu=False,
        training_config=training,
        rollout_config=rollout if config.baseline == "group" else with_greedy_eval(rollout),
    )


def rolled_out(config: GRPOConfig) -> int:
    """Prompts a step rolls out: batch_size, times oversample."""
    return config.batch_size * config.oversample


def with_greedy_eval(
    rollout: base_rollout.RolloutConfig,
) -> dict[rl_cluster_lib.Mode, base_rollout.RolloutConfig]:
    """The rollout configs by mode: TRAIN samples, EVAL decodes greedily (Tunix's sampler is
    greedy when top_p and top_k are None); the greedy baseline decodes with EVAL."""
    greedy = dataclasses.replace(rollout, top_p=None, top_k=None, seed=None)
    return {rl_cluster_lib.Mode.TRAIN: rollout, rl_cluster_lib.Mode.EVAL: greedy}


def greedy_decode(cluster: tunix_api.RLEngine, prompts: list[str]) -> list[str]:
    """`prompts`' greedy completions by the cluster's current rollout policy. `cluster.generate`
    is looked up at each call, so the phase timer's wrapper counts it as rollout time."""
    return list(cluster.generate(prompts=prompts, mode=rl_cluster_lib.Mode.EVAL).text)


def algorithm_config(config: GRPOConfig) -> grpo_learner.GRPOConfig:
    """Tunix's algorithm config for the recipe's algorithm (its learner takes it)."""
    shared = {
        "num_generations": config.num_generations,
        "num_iterations": config.num_iterations,
        "epsilon": config.epsilon,
        # the summed reward with not-applicable terms left out and overflows stopped
        "reward_manager": reward_sums.NAME,
    }
    if config.algorithm == "dapo":
        penalty = config.overlong_penalty
        return dapo_learner.DAPOConfig(
            **shared,
            beta=None,
            epsilon_high=config.epsilon_high or config.epsilon,
            overlong_buffer=None
            if penalty is None
            else {
                "enable": True,
                "overlong_buffer_length": penalty.buffer_chars,
                "overlong_buffer_penalty": penalty.penalty,
                "max_response_length": penalty.max_chars,
            },
        )
    if config.algorithm == "dr-grpo":
        return drgrpo_learner.DrGRPOConfig(**shared, beta=config.beta)
    estimator = {"drop": advantages.INFORMATIVE_GROUPS, "count": "grpo"}[config.flat_groups]
    if config.baseline == "greedy":  # the recipe refuses it with flat_groups: drop
        estimator = advantages.GREEDY_BASELINE
    return grpo_learner.GRPOConfig(
        **shared, beta=config.beta, loss_algo=config.algorithm, advantage_estimator=estimator
    )


_LEARNERS: dict[str, type[grpo_learner.GRPOLearner]] = {
    "grpo": grpo_learner.GRPOLearner,
    "gspo-token": grpo_learner.GRPOLearner,
    "dapo": dapo_learner.DAPOLearner,
    "dr-grpo": drgrpo_learner.DrGRPOLearner,
}


def _learner(
    cluster: tunix_api.RLEngine,
    config: GRPOConfig,
    reward_fns: list[Callable[..., Any]],
    observer: metrics.StepObserver,
) -> grpo_learner.GRPOLearner:
    return _LEARNERS[config.algorithm](
        **{tunix_api.LEARNER_ENGINE_ARG: cluster},
        algo_config=algorithm_config(config),
        reward_fns=reward_fns,
        metric_fns=[observer],
    )


def _reward_fns(
    cluster: tunix_api.RLEngine,
    config: GRPOConfig,
    sandbox: rewards.SandboxStats,
    answer_format: AnswerFormat,
) -> tuple[list[Callable[..., Any]], greedy_baseline.GreedyBaseline | None]:
    """The recipe's rewards in Tunix's shape, and last, with `baseline: greedy`, the greedy
    baseline's term (-R(greedy) per row: stages/grpo/baseline.py)."""
    fns: list[Callable[..., Any]] = list(
        rewards.tunix_reward_fns(config.rewards, sandbox, answer_format)
    )
    if config.baseline == "group":
        return fns, None
    baseline = greedy_baseline.GreedyBaseline(
        fns, config.num_generations, functools.partial(greedy_decode, cluster)
    )
    return [*fns, baseline], baseline


def build_session(
    directory: str,
    dataset: DatasetArtifact,
    sft: CheckpointArtifact,
    config: GRPOConfig,
    spec: ModelSpec,
    mesh_spec: MeshSpec,
    ctx: RunContext,
    rollout_mesh: Any | None = None,
) -> Session:
    """The cluster (restored from `directory`'s checkpoints if any) and learner of a session.

    `rollout_mesh` puts the rollout model apart from the actor, with Tunix's own engine (a
    copy of the weights synced every step, one sampling seed for all steps); the stage runs
    everything on one mesh, the tests use it to show Tunix's stale-rollout resume defect."""
    sinks = metrics_logging.for_stage(ctx.metrics_logging, ctx.run, ctx.run_uri, directory)
    tokenizer = build_tokenizer(spec, ctx.model_cache, ctx.shared)
    mesh = models.build_mesh(mesh_spec)
    reference, actor = _reference_and_actor(sft, spec, mesh, ctx)
    dirs = training_tail.session_dirs(directory)
    eos = [tokenizer.eos_id(), tokenizer.end_of_turn_id()]
    cluster = tunix_api.RLEngine(
        actor=actor,
        reference=reference,
        tokenizer=tokenizer,
        cluster_config=_cluster_config(
            config,
            dataset.prompt_len,
            dirs.local_ckpt,
            dirs.local_logs,
            (mesh, rollout_mesh or mesh),
            eos,
            sinks,
        ),
    )
    seeds: list[tuple[int, int]] = []
    if isinstance(cluster.rollout, tunix_compat.SeededRollout):
        cluster.rollout.follow(lambda: cluster.global_steps)
        seeds = cluster.rollout.seeds_used
    sandbox = rewards.stats_for(ctx)
    # the rewards grade in the format the dataset was written in (data.prompt.answer_format)
    reward_fns, baseline = _reward_fns(cluster, config, sandbox, dataset.prompt.answer_format)
    observer = metrics.StepObserver(
        config.num_generations,
        config.samples_per_step,
        lambda: cluster.global_steps,
        lambda step: next((seed for t, seed in reversed(seeds) if t == step), None),
        dataset.prompt.answer_format,
        baseline,
    )
    learner = _learner(cluster, config, reward_fns, observer)
    transform = example_transform(config, session_metrics(cluster))
    if transform is not None:  # the actor update without rows or columns that add nothing
        tunix_compat.transform_train_examples(learner, transform)
    return Session(cluster, learner, observer, sandbox, mesh, tokenizer.name, dirs)


def session_metrics(cluster: tunix_api.RLEngine) -> Callable[[dict[str, float]], None]:
    """Log {name: value} at the cluster's current step (Tunix averages repeats in a step)."""
    return lambda values: cluster.buffer_metrics({k: (v, np.mean) for k, v in values.items()})


def example_transform(
    config: GRPOConfig, emit: Callable[[dict[str, float]], None] = lambda values: None
) -> Callable[[Any], Any] | None:
    """What the recipe cuts from each step's training example before the actor update: the
    groups beyond batch_size (oversample; `emit` gets the kept groups' informative share),
    the groups without gradient (skip_flat_groups), then the padding no row uses
    (trim_padding), then each group's repeated prompt rows (share_prompts); None when
    nothing."""
    steps: list[Callable[[Any], Any]] = []
    if config.oversample > 1:
        steps.append(functools.partial(_keep_groups, config=config, emit=emit))
    if config.skip_flat_groups:
        steps.append(
            functools.partial(advantages.informative_rows, num_generations=config.num_generations)
        )
    if config.trim_padding is not None:
        steps.append(
            functools.partial(
                tunix_compat.trim_train_example,
                multiple=config.trim_padding,
                completions=config.algorithm != "dr-grpo",
            )
        )
    if config.share_prompts:
        steps.append(
            functools.partial(tunix_compat.share_group_prompts, group=config.num_generations)
        )
    if not steps:
        return None
    return functools.reduce(lambda f, g: lambda example: g(f(example)), steps)


def _keep_groups(example: Any, config: GRPOConfig, emit: Callable[[dict[str, float]], None]) -> Any:
    kept, informative = advantages.oversampled_groups(
        example, config.num_generations, config.batch_size, config.flat_groups == "drop"
    )
    emit({metrics.UPDATE_INFORMATIVE: informative})
    return kept


def _reference_and_actor(
    sft: CheckpointArtifact, spec: ModelSpec, mesh: Any, ctx: RunContext
) -> tuple[Any, Any]:
    """The starting policy twice: a frozen one, the KL reference, and the actor.

    The KL term keeps the actor near the policy GRPO started from, as DPO's reference does.
    (With the LoRA-free base as reference, the KL term pulled a LoRA actor back towards the
    pretrained model and undid SFT whenever the rewards gave no signal.) LoRA: one restore,
    and the actor is a copy of its adapters on the same frozen base weights. Full weights:
    two restores, each into a private base.
    """
    if sft.lora is None:
        reference, actor = (
            models.restore_policy(sft, models.build_base_model(spec, mesh, ctx.model_cache), mesh)
            for _ in range(2)
        )
        return reference, actor
    base = models.base_model(spec, mesh, ctx.model_cache, ctx.shared, private=False)
    reference = models.restore_policy(sft, base, mesh)
    return reference, models.copy_lora_policy(reference, mesh)


@dataclass
class Session:
    """One GRPO session's Tunix objects and where its outputs go."""

    cluster: tunix_api.RLEngine
    learner: grpo_learner.GRPOLearner
    observer: metrics.StepObserver
    sandbox: rewards.SandboxStats
    mesh: Any
    tokenizer_name: str
    dirs: training_tail.SessionDirs

    def steps_done(self, config: GRPOConfig) -> int:
        """GRPO steps (prompt batches) trained, from the actor's optimizer-update count."""
        return self.cluster.actor_trainer.train_steps // config.num_iterations


def _reinforce(
    directory: str,
    dataset: DatasetArtifact,
    sft: CheckpointArtifact,
    config: GRPOConfig,
    spec: ModelSpec,
    mesh_spec: MeshSpec,
    ctx: RunContext,
) -> tuple[CheckpointArtifact, dict[str, float], dict[str, list[float]]]:
    session = build_session(directory, dataset, sft, config, spec, mesh_spec, ctx)
    history = metrics.MetricsHistory()
    session.cluster.with_external_metrics_logger(history)
    # A restored actor resumes at its step: skip the prompt batches it already trained on
    # (one batch per step), so the run continues at the exact prompt position.
    start_step = session.steps_done(config)
    if start_step:
        tunix_compat.resync_after_restore(session.cluster, session.learner, start_step)
    tunix_compat.skip_tunix_fast_forward(session.learner)
    if ctx.progress is not None:  # FAR draws the stage's bar: not Tunix's actor bar too
        tunix_compat.hide_progress_bar(session.cluster.actor_trainer)
    timing.instrument(session.cluster, session.learner)  # far/seconds/<phase> per step
    tail = training_tail.TrainingTail(
        "GRPO",
        session.cluster.actor_trainer,  # its failed async checkpoint save ends the session
        session.dirs,
        config.max_steps,
        config.save_margin_seconds,
        start_step,
        lambda: session.steps_done(config),
    )
    if start_step < config.max_steps:  # Tunix would train one more step on a finished run
        rows = load_prompts(dataset, "grpo_train")
        batches = itertools.islice(
            prompt_batches(rows, rolled_out(config), config.seed), start_step, None
        )
        started = time.perf_counter()
        tail.train(
            functools.partial(_learn, session.learner),
            batches,
            ctx,
            session.mesh,
            report=lambda stream: reporting(
                stream,
                ctx.progress,
                "grpo",
                start_step,
                config.max_steps,
                metrics=history.latest_reward,
            ),
        )
        report_end(
            ctx.progress,
            "grpo",
            start_step,
            session.steps_done(config),
            config.max_steps,
            time.perf_counter() - started,
            history.latest_reward(),
        )
    save_samples(storage.join(directory, SAMPLES_FILE), session.observer.samples, start_step)
    curves = lambda: history.curves(actor_kl(session.cluster))  # noqa: E731
    loggers = tunix_compat.cluster_metrics_loggers(session.cluster)
    tail.publish(loggers, curves=curves, primary=ctx.primary)
    whole, first_step = tail.whole_history(curves())
    artifact, scalars = _results(session, config, spec, sft, whole, tail)
    scalars["history_from_step"] = float(first_step)
    return artifact, {**scalars, **compilation_metrics(tail.compiles)}, whole


def _learn(learner: grpo_learner.GRPOLearner, stream: Iterator[Any]) -> None:
    """Train on `stream`, unless it is empty: a session with no time left for one step stops
    where it was restored (Tunix's learner reads a first batch before its loop and fails on
    none). The learner's close() saves the last checkpoint."""
    first_batch_and_rest = nonempty(stream)
    if first_batch_and_rest is not None:
        learner.train(first_batch_and_rest)


def compilation_metrics(compiles: CompileCounter | None) -> dict[str, float]:
    """This session's compilations of the actor's train step and of the rollout sampler."""
    counts = {"train_step_compilations": compiles.count_of(TRAIN_STEP) if compiles else 0}
    for part, function in SAMPLER_FUNCTIONS.items():
        counts[f"rollout_{part}_compilations"] = compiles.count_of(function) if compiles else 0
    return {name: float(count) for name, count in counts.items()}


def _results(
    session: Session,
    config: GRPOConfig,
    spec: ModelSpec,
    sft: CheckpointArtifact,
    history: Mapping[str, list[float]],
    tail: training_tail.TrainingTail,
) -> tuple[CheckpointArtifact, dict[str, float]]:
    """The committed actor, and the record's scalars: `history` (every session's curves)
    summed up, and this session's sandbox counts."""
    artifact = tail.commit(
        spec,
        session.tokenizer_name,
        sft.lora,
        subdir=ACTOR_SUBDIR,
        # Tunix numbers checkpoints by optimizer update: num_iterations per GRPO step
        step=config.max_steps * config.num_iterations,
    )
    scalars = {
        **metrics.summary(history),
        "resumed_from_step": float(tail.start_step),
        "sandbox_runs": float(session.sandbox.runs),
        "sandbox_failures": float(session.sandbox.failures),
        **rewards.isolation_metrics(session.sandbox),
    }
    return artifact, scalars


def actor_kl(cluster: tunix_api.RLEngine) -> list[float]:
    """KL to the reference per optimizer update of this session (Tunix logs it as actor/kl)."""
    return train_curve(cluster.actor_trainer.metrics_logger, "kl", prefix="actor")


def save_samples(uri: str, samples: list[dict[str, Any]], start_step: int) -> None:
    """Append this session's sample completions to the stage's samples.jsonl; rows of steps
    at or after `start_step` from an earlier session were not checkpointed and are dropped."""
    kept: list[str] = []
    if storage.exists(uri):
        kept = [
            line
            for line in storage.read_text(uri).splitlines()
            if line and json.loads(line)["step"] < start_step
        ]
    kept += [json.dumps(sample, sort_keys=True) for sample in samples]
    storage.write_text(uri, "".join(line + "\n" for line in kept))


def identity(
    config: GRPOConfig, model: ModelSpec, dataset_fingerprint: str, sft_fingerprint: str
) -> StageIdentity:
    inputs = {"dataset": dataset_fingerprint, "sft": sft_fingerprint}
    code = rewards.reward_sources(list(config.rewards))  # a user's rewards: their code
    hashed = hashed_config("grpo", config)
    return stage_identity("grpo", STAGE_VERSION, hashed, inputs, model=model, code=code)


@fast_paths.scoped(*fast_paths.ALL)
def reinforce(
    dataset: DatasetArtifact,
    sft: CheckpointArtifact,
    config: GRPOConfig,
    model: ModelSpec,
    mesh: MeshSpec,
    ctx: RunContext,
) -> StageOutcome[CheckpointArtifact]:
    """Run GRPO from the SFT checkpoint (or reuse a committed result)."""
    tokenizer_name = build_tokenizer(model, ctx.model_cache, ctx.shared).name
    check_dataset(dataset, tokenizer_name)
    check_pool(dataset, config)
    models.check_compatible(sft, model, tokenizer_name)
    rewards.validate_names(config.rewards)
    return run_stage_on_artifacts(
        ctx,
        identity(config, model, dataset.fingerprint, sft.fingerprint),
        {"dataset": dataset, "sft": sft},
        lambda directory: _reinforce(directory, dataset, sft, config, model, mesh, ctx),
        carry_over=training_tail.CARRY_OVER,
    )


def check_pool(dataset: DatasetArtifact, config: GRPOConfig) -> None:
    """Refuse a prompt pool smaller than one step's prompts, before any compute (a step
    takes whole batches: with fewer rows the prompt stream would never yield one)."""
    pool = dataset.split_sizes.get("grpo_train", 0)
    if pool < rolled_out(config):
        raise InputError(
            f"dataset {dataset.uri} has {pool} grpo_train prompts, fewer than one GRPO step "
            f"takes (grpo.batch_size {config.batch_size} x grpo.oversample "
            f"{config.oversample}); lower batch_size or oversample, or give the stage more "
            f"prompts (data.grpo.size, or a hard_subset's min_prompts)"
        )


def run(
    inputs: Mapping[str, Artifact], config: GRPOConfig, ctx: RunContext
) -> StageOutcome[CheckpointArtifact]:
    """The registered entry point (stages/registry.py): `dataset` and the `policy` to start from."""
    dataset = require_input(inputs, "dataset", DatasetArtifact)
    policy = require_input(inputs, "policy", CheckpointArtifact)
    return reinforce(dataset, policy, config, ctx.require_model(), ctx.mesh, ctx)
