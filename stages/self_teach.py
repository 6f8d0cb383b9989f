"""Self-teaching stage: the model's own verified completions become new SFT data.

Entry point: `teach(dataset, policy, config, model, mesh, ctx) -> StageOutcome[DatasetArtifact]`.

For each prompt of the dataset's `config.split`, `config.samples` completions are sampled from
the policy checkpoint; a completion is kept when every reward in `config.verify` (registered
rewards; math and code verifiers run in the sandbox) scores at least `config.min_score`, at
most `config.keep_per_prompt` distinct ones per prompt. Kept completions are tokenized as SFT
rows (prompt masked out, completion trained) in the dataset format, so a following `sft` node
trains on them; teach.jsonl names, per row, the checkpoint, the prompt, the sample and its
rewards. The grpo_train and eval prompt splits are carried over.

Sampling goes in chunks of `batch_size` prompts x samples, each written to chunks/ as it
finishes with its own seed: a session stopped between chunks resumes at the next one and
draws exactly what an uninterrupted run would.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from schemas.artifacts import Artifact, CheckpointArtifact, DatasetArtifact
from schemas.recipe import AnswerFormat, MeshSpec, ModelSpec, SelfTeachConfig
from stages import rewards
from stages.core import storage
from stages.core.datasets import (
    check_dataset,
    jsonl_bytes,
    load_prompts,
    pad_rows,
    write_derived_dataset,
)
from stages.core.errors import InputError
from stages.core.runner import (
    RunContext,
    SessionExpired,
    StageIdentity,
    StageOutcome,
    require_input,
    run_stage_on_artifacts,
    stage_identity,
)
from stages.modeling import fast_paths, generation, models
from stages.modeling.tokenizers import Tokenizer, build_tokenizer
from stages.registry import hashed_config

log = logging.getLogger(__name__)
# 2: its format_strict check wants each tag once, nothing after the answer but end of turn
STAGE_VERSION = 2
CHUNKS_DIR = "chunks"
ROWS_FILE = "teach.jsonl"
END_OF_TURN = "<end_of_turn>"


def verified(
    rows: list[dict[str, Any]],
    completions: list[str],
    config: SelfTeachConfig,
    answer_format: AnswerFormat = "tags",
) -> list[dict[str, Any]]:
    """Every sample with its reward scores and whether all of `config.verify` pass, graded in
    the dataset's answer format.

    `completions` are prompt-major: config.samples per row.
    """
    stats = rewards.SandboxStats()
    expanded = [r for r in rows for _ in range(config.samples)]
    refs = rewards.row_references(expanded, answer_format)
    scores = {
        name: rewards.get_reward(name).score(completions, refs, stats) for name in config.verify
    }
    out = []
    for i, (row, completion) in enumerate(zip(expanded, completions, strict=True)):
        # a user's batch reward may say None (not applicable): it neither passes nor fails
        rewarded = {n: float(s) for n, v in scores.items() if (s := v[i]) is not None}
        out.append(
            {
                "prompt_id": row["id"],
                "prompt": row["prompt"],
                "sample": i % config.samples,
                "completion": completion,
                "rewards": rewarded,
                "verified": bool(rewarded)
                and all(v >= config.min_score for v in rewarded.values()),
            }
        )
    return out


def keep(samples: list[dict[str, Any]], per_prompt: int) -> list[dict[str, Any]]:
    """Verified samples, at most `per_prompt` distinct completions per prompt, in order."""
    kept: dict[str, list[str]] = {}
    out = []
    for sample in samples:
        seen = kept.setdefault(sample["prompt_id"], [])
        if sample["verified"] and len(seen) < per_prompt and sample["completion"] not in seen:
            seen.append(sample["completion"])
            out.append(sample)
    return out


def sft_sequence(prompt: str, completion: str, tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """(tokens, loss mask): BOS and the chat prompt 0; the completion, end of turn, EOS 1."""
    target = completion.strip().removesuffix(END_OF_TURN).rstrip() + END_OF_TURN
    head = [tokenizer.bos_id(), *tokenizer.encode(prompt)]
    tail = [*tokenizer.encode(target), tokenizer.eos_id()]
    return head + tail, [0] * len(head) + [1] * len(tail)


def _sample_chunks(
    directory: str,
    rows: list[dict[str, Any]],
    sampler: Any,
    tokenizer: Tokenizer,
    config: SelfTeachConfig,
    prompt_len: int,
    ctx: RunContext,
    answer_format: AnswerFormat = "tags",
) -> list[dict[str, Any]]:
    """Every sample, chunk by chunk; chunks written by an earlier session are read back."""
    samples: list[dict[str, Any]] = []
    for number, start in enumerate(range(0, len(rows), config.batch_size)):
        chunk_uri = storage.join(directory, CHUNKS_DIR, f"{number:05d}.jsonl")
        if storage.exists(chunk_uri):
            text = storage.read_text(chunk_uri)
            samples += [json.loads(line) for line in text.splitlines() if line]
            continue
        _check_session(ctx, number)
        chunk = rows[start : start + config.batch_size]
        completions = generation.generate(
            sampler,
            tokenizer,
            [r["prompt"] for r in chunk for _ in range(config.samples)],
            prompt_len=prompt_len,
            max_tokens=config.max_generation_tokens,
            batch_size=config.batch_size,
            temperature=config.temperature,
            seed=config.seed + 1000 * number,
            draw=config.draw,
        )
        scored = verified(chunk, completions, config, answer_format)
        storage.write_bytes(chunk_uri, jsonl_bytes(scored))
        samples += scored
    return samples


def _check_session(ctx: RunContext, chunk: int) -> None:
    left = ctx.seconds_left()
    if (left is not None and left <= 0) or (ctx.stop is not None and ctx.stop.is_set()):
        raise SessionExpired(f"self_teach stopped before chunk {chunk}; it resumes there")


def _teach(
    directory: str,
    dataset: DatasetArtifact,
    policy: CheckpointArtifact,
    config: SelfTeachConfig,
    spec: ModelSpec,
    mesh_spec: MeshSpec,
    ctx: RunContext,
) -> tuple[DatasetArtifact, dict[str, float], dict[str, list[float]]]:
    tokenizer = build_tokenizer(spec, ctx.model_cache, ctx.shared)
    mesh = models.build_mesh(mesh_spec)
    rows = load_prompts(dataset, config.split)
    with mesh:
        network = models.policy_network(policy, mesh, ctx.model_cache, ctx.shared)
        sampler = generation.build_sampler(
            network, tokenizer, spec, dataset.prompt_len, config.max_generation_tokens
        )
        samples = _sample_chunks(
            directory,
            rows,
            sampler,
            tokenizer,
            config,
            dataset.prompt_len,
            ctx,
            dataset.prompt.answer_format,
        )
    kept = keep(samples, config.keep_per_prompt)
    sequences = [sft_sequence(s["prompt"], s["completion"], tokenizer) for s in kept]
    fitting = [(k, q) for k, q in zip(kept, sequences, strict=True) if len(q[0]) <= dataset.seq_len]
    if not fitting:
        raise InputError(
            f"self_teach kept no completion: none of {len(samples)} samples scored >= "
            f"{config.min_score} on every reward of {config.verify} within {dataset.seq_len} tokens"
        )
    provenance = [
        {**s, "checkpoint": policy.uri, "checkpoint_fingerprint": policy.fingerprint}
        for s, _ in fitting
    ]
    arrays = pad_rows([q for _, q in fitting], dataset.seq_len, tokenizer.pad_id())
    carried = {split: load_prompts(dataset, split) for split in ("grpo_train", "eval")}
    artifact = write_derived_dataset(
        directory, dataset, carried, arrays, {ROWS_FILE: jsonl_bytes(provenance)}
    )
    metrics = {
        "prompts": float(len(rows)),
        "samples": float(len(samples)),
        "verified_fraction": sum(s["verified"] for s in samples) / len(samples),
        "rows_kept": float(len(fitting)),
        "prompts_with_a_kept_row": float(len({s["prompt_id"] for s, _ in fitting})),
    }
    return artifact, metrics, {}


def identity(
    config: SelfTeachConfig, model: ModelSpec, dataset_fingerprint: str, policy_fingerprint: str
) -> StageIdentity:
    hashed = hashed_config("self_teach", config)
    inputs = {"dataset": dataset_fingerprint, "policy": policy_fingerprint}
    code = rewards.reward_sources(config.verify)  # a user's rewards: their code
    return stage_identity("self_teach", STAGE_VERSION, hashed, inputs, model=model, code=code)


@fast_paths.scoped("lora_backward", "prefill_last_position", "draw")
def teach(
    dataset: DatasetArtifact,
    policy: CheckpointArtifact,
    config: SelfTeachConfig,
    model: ModelSpec,
    mesh: MeshSpec,
    ctx: RunContext,
) -> StageOutcome[DatasetArtifact]:
    """SFT data from `policy`'s own completions that the rewards verify (or the committed one)."""
    tokenizer_name = build_tokenizer(model, ctx.model_cache, ctx.shared).name
    check_dataset(dataset, tokenizer_name)
    models.check_compatible(policy, model, tokenizer_name)
    for name in config.verify:
        rewards.get_reward(name)
    return run_stage_on_artifacts(
        ctx,
        identity(config, model, dataset.fingerprint, policy.fingerprint),
        {"dataset": dataset, "policy": policy},
        lambda directory: _teach(directory, dataset, policy, config, model, mesh, ctx),
    )


def run(
    inputs: Mapping[str, Artifact], config: SelfTeachConfig, ctx: RunContext
) -> StageOutcome[DatasetArtifact]:
    """The registered entry point (stages/registry.py): `dataset` and the `policy` sampled."""
    dataset = require_input(inputs, "dataset", DatasetArtifact)
    policy = require_input(inputs, "policy", CheckpointArtifact)
    return teach(dataset, policy, config, ctx.require_model(), ctx.mesh, ctx)
