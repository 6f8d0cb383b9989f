"""Evaluation stage: greedy generation on held-out prompts for base, SFT and GRPO models.

Entry point: `evaluate(dataset, checkpoints, config, model, mesh, ctx) -> StageOutcome[EvalReport]`.

Each model answers every eval prompt with Tunix's Sampler (greedy, fixed prompt length, the
prompt list padded to whole batches so every batch has one compiled shape). Metrics: format
compliance (the strict reward) and answer accuracy; every sample is stored beside them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import numpy as np
from tunix.generate import sampler as tunix_sampler

from schemas.artifacts import CheckpointArtifact, DatasetArtifact, EvalReport, ModelScores
from schemas.recipe import EvalConfig, MeshSpec, ModelSpec
from stages import models, rewards, storage
from stages.data_prep import load_prompts
from stages.runner import RunContext, StageIdentity, StageOutcome, run_stage
from stages.sft import check_dataset
from stages.tokenizers import Tokenizer, build_tokenizer

log = logging.getLogger(__name__)
STAGE_VERSION = 1


def generate(
    network: Any,
    tokenizer: Tokenizer,
    prompts: list[str],
    config: EvalConfig,
    prompt_len: int,
    spec: ModelSpec,
) -> list[str]:
    """Greedy completions, batch by batch; the last batch is padded with repeats, then cut."""
    arch = models.tunix_config(spec)
    sampler = tunix_sampler.Sampler(
        network,
        tokenizer,
        tunix_sampler.CacheConfig(
            cache_size=prompt_len + config.max_generation_tokens + 8,
            num_layers=arch.num_layers,
            num_kv_heads=arch.num_kv_heads,
            head_dim=arch.head_dim,
        ),
    )
    eos = [tokenizer.eos_id(), tokenizer.end_of_turn_id()]
    out: list[str] = []
    for start in range(0, len(prompts), config.batch_size):
        batch = prompts[start : start + config.batch_size]
        padded = batch + [batch[-1]] * (config.batch_size - len(batch))
        result = sampler(
            padded,
            max_generation_steps=config.max_generation_tokens,
            max_prompt_length=prompt_len,
            eos_tokens=eos,
        )
        out.extend(result.text[: len(batch)])
    return out


def score(
    name: str, uri: str | None, rows: list[dict[str, str]], completions: list[str]
) -> ModelScores:
    fmt = [rewards.format_strict(c, r["answer"]) for c, r in zip(completions, rows, strict=True)]
    acc = [rewards.answer_match(c, r["answer"]) for c, r in zip(completions, rows, strict=True)]
    return ModelScores(
        name=name,
        checkpoint_uri=uri,
        num_prompts=len(rows),
        format_rate=float(np.mean(fmt)),
        accuracy=float(np.mean(acc)),
        mean_completion_chars=float(np.mean([len(c) for c in completions])),
    )


def markdown_table(scores: list[ModelScores]) -> str:
    lines = [
        "| model | prompts | format rate | accuracy | mean completion chars |",
        "|---|---:|---:|---:|---:|",
    ]
    for s in scores:
        lines.append(
            f"| {s.name} | {s.num_prompts} | {s.format_rate:.3f} | {s.accuracy:.3f} "
            f"| {s.mean_completion_chars:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _evaluate(
    directory: str,
    dataset: DatasetArtifact,
    checkpoints: dict[str, CheckpointArtifact],
    config: EvalConfig,
    spec: ModelSpec,
    mesh_spec: MeshSpec,
    cache_dir: str,
) -> tuple[EvalReport, dict[str, float]]:
    tokenizer = build_tokenizer(spec, cache_dir)
    mesh = models.build_mesh(mesh_spec)
    rows = load_prompts(dataset, "eval")
    prompts = [r["prompt"] for r in rows]
    scores, samples = [], []
    base = models.build_base_model(
        spec, mesh, cache_dir
    )  # LoRA policies share (and never change) it
    for name in config.models:
        artifact = checkpoints.get(name)
        with mesh:
            if artifact is None:
                network = base
            else:
                own_base = base if artifact.lora else models.build_base_model(spec, mesh, cache_dir)
                network = models.restore_policy(artifact, own_base, mesh)
            completions = generate(network, tokenizer, prompts, config, dataset.prompt_len, spec)
        scores.append(score(name, artifact.uri if artifact else None, rows, completions))
        samples += [
            {"model": name, "id": r["id"], "answer": r["answer"], "completion": c}
            for r, c in zip(rows, completions, strict=True)
        ]
        log.info("evaluated %s: %s", name, scores[-1])
    samples_bytes = "".join(json.dumps(s, sort_keys=True) + "\n" for s in samples).encode()
    samples_uri = storage.join(directory, "samples.jsonl")
    storage.write_bytes(samples_uri, samples_bytes)
    storage.write_text(storage.join(directory, "report.md"), markdown_table(scores))
    report_uri = storage.join(directory, "report.json")
    report = EvalReport(
        uri=report_uri,
        samples_uri=samples_uri,
        scores=scores,
        fingerprint=hashlib.sha256(samples_bytes).hexdigest(),
    )
    storage.write_json(report_uri, report.model_dump(mode="json"))
    metrics = {f"{s.name}/{m}": getattr(s, m) for s in scores for m in ("format_rate", "accuracy")}
    return report, metrics


def identity(
    config: EvalConfig,
    model: ModelSpec,
    dataset_fingerprint: str,
    checkpoint_fingerprints: dict[str, str],
) -> StageIdentity:
    hashed = {"eval": config.model_dump(mode="json"), "model": model.model_dump(mode="json")}
    inputs = {"dataset": dataset_fingerprint, **dict(sorted(checkpoint_fingerprints.items()))}
    return StageIdentity("evaluate", STAGE_VERSION, hashed, inputs)


def evaluate(
    dataset: DatasetArtifact,
    checkpoints: dict[str, CheckpointArtifact],
    config: EvalConfig,
    model: ModelSpec,
    mesh: MeshSpec,
    ctx: RunContext,
) -> StageOutcome[EvalReport]:
    """Evaluate `config.models` ('base' needs no checkpoint; others must be in `checkpoints`)."""
    tokenizer_name = build_tokenizer(model, ctx.model_cache).name
    check_dataset(dataset, tokenizer_name)
    missing = [m for m in config.models if m != "base" and m not in checkpoints]
    if missing:
        raise ValueError(
            f"eval.models lists {missing} but no checkpoint was given for them; "
            f"given: {sorted(checkpoints)}"
        )
    for artifact in checkpoints.values():
        models.check_compatible(artifact, model, tokenizer_name)
    fingerprints = {name: a.fingerprint for name, a in checkpoints.items()}
    return run_stage(
        ctx,
        identity(config, model, dataset.fingerprint, fingerprints),
        lambda directory: _evaluate(
            directory, dataset, checkpoints, config, model, mesh, ctx.model_cache
        ),
    )
