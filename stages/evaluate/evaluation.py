"""The evaluate stage: generate on held-out prompts for each model, score, report.

The prompts are the dataset's `eval` split, or with `config.split` its `grpo_train` split
(which training prompts a model still fails, for hard_subset; the eval split stays held out).

Entry point: `evaluate(dataset, checkpoints, config, model, mesh, ctx) -> StageOutcome[EvalReport]`.

Generation is batched with fixed shapes (prompts padded to the dataset's prompt length, the
last batch filled with repeats) and, when greedy, gives exactly the batch-size-1 outputs
(tested). Scores come from the registered rewards: format compliance, math answers equal
numerically or symbolically (SymPy, sandboxed), code passing its tests (sandboxed): pass@1,
pass@k and majority vote with sampling; the base model also k-shot. Each rate carries a
Wilson 95% interval and each model a paired exact McNemar comparison with the one before it
(stages/core/stats.py). Outputs: report.json, report.md (base vs SFT vs GRPO, per domain),
metrics.png and training.png, samples.jsonl; and each evaluated checkpoint of this run gets
its scores in a write-once file beside its record (a checkpoint of another run: in this
stage's own directory, with that checkpoint's record digest; the other run is never written).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.artifacts import (
    STEP_SUFFIX,
    Artifact,
    CheckpointArtifact,
    DatasetArtifact,
    EvalReport,
    ModelScores,
)
from schemas.recipe import AnswerFormat, EvalConfig, MeshSpec, ModelSpec
from stages import rewards
from stages.core.checkpoints import saved_steps
from stages.core.datasets import check_dataset, load_prompts, load_sft_arrays
from stages.core.errors import InputError
from stages.core.records import find_checkpoint_record, located_output
from stages.core.runner import (
    RunContext,
    StageIdentity,
    StageOutcome,
    require_input,
    run_stage_on_artifacts,
    stage_identity,
)
from stages.core.shared import SharedBuilds
from stages.evaluate import fewshot, headroom, reports
from stages.evaluate.progress import BatchTally, EvalProgress
from stages.modeling import fast_paths, generation, models
from stages.modeling.compilations import SAMPLER_FUNCTIONS, CompileCounter, counting_compilations
from stages.modeling.tokenizers import Tokenizer, build_tokenizer
from stages.registry import hashed_config
from stages.rewards.answers import extract_answer

log = logging.getLogger(__name__)
# 3: k-shot base row, Wilson intervals, paired McNemar comparisons
# 4: sampled models get the headroom metrics (unbiased pass@k, solve-rate histogram) and, with
#    `greedy`, a greedy row; every model's metrics say its samples per prompt
# 5: each row is compared with the row before it decoded the same way (greedy with greedy:
#    version 4 set a sampled row against the greedy row before it), and sampled rows also by
#    their per-prompt solve rates (pass@1, paired sign-flip test)
# 6: a sampled row's Wilson intervals count prompts, not completions (a prompt's samples are
#    correlated: version 5's intervals were too narrow)
# 7: format_strict wants each tag once and nothing after the answer but the end-of-turn
#    marker (version 6 credited a second <answer> after the first, or a stray </reasoning>)
# 8: a text answer is compared as text (version 7 sent it to math-verify, which read a word as
#    a product of letters and graded its anagrams correct); numeric answers grade as before
# 9: `steps: saved` scores the earlier steps on the stage's save grid only (version 8 also
#    scored a save a session's stop forced, and GRPO's and DPO's first step)
# 10: greedy batches are made of prompts of like length (generation.length_order): the same
#     completions, fewer decode steps; a session of version 9 numbered its kept batches in the
#     split's order, so the two must not mix
STAGE_VERSION = 10


def generate(
    network: Any,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    config: EvalConfig,
    prompt_len: int,
    spec: ModelSpec,
    progress: EvalProgress | None = None,
) -> list[str]:
    """Completions batch by batch at one compiled shape (the shared sampling loop); greedy
    unless config.temperature.

    With `progress`, batches a session already finished are read back instead of generated
    (`network` may then be None if all are), and each new batch is kept as soon as it is done.
    """
    sampler = None
    if network is not None:
        sampler = generation.build_sampler(
            network, tokenizer, spec, prompt_len, config.max_generation_tokens
        )
    return generation.generate(
        sampler,
        tokenizer,
        prompts,
        prompt_len=prompt_len,
        max_tokens=config.max_generation_tokens,
        batch_size=config.batch_size,
        temperature=config.temperature,
        seed=config.seed,
        store=progress,
        draw=config.draw,
        by_length=not config.temperature,
    )


def correctness(
    rows: Sequence[dict[str, Any]],
    completions: Sequence[str],
    stats: rewards.SandboxStats,
    answer_format: AnswerFormat = "tags",
) -> tuple[list[float], list[float]]:
    """(exact, correct) per completion: code needs every test to pass."""
    refs = _references(rows, answer_format)
    exact = [
        float(s or 0.0) for s in rewards.REGISTRY["answer_match"].score(completions, refs, stats)
    ]
    code = [i for i, r in enumerate(rows) if r.get("tests")]
    math = [i for i, r in enumerate(rows) if not r.get("tests")]
    correct = [0.0] * len(rows)
    for indices, name in ((math, "math_equivalent"), (code, "code_pass_rate")):
        scored = rewards.REGISTRY[name].score(
            [completions[i] for i in indices], [refs[i] for i in indices], stats
        )
        for i, value in zip(indices, scored, strict=True):
            correct[i] = 1.0 if value == 1.0 else 0.0
    return exact, correct


def score(
    name: str,
    uri: str | None,
    rows: Sequence[dict[str, Any]],
    completions: Sequence[str],
    samples: int,
    sandbox: rewards.SandboxStats | None = None,
    rewards_to_score: Sequence[str] = (),
    answer_format: AnswerFormat = "tags",
) -> tuple[ModelScores, list[dict[str, Any]]]:
    """Scores over prompts x samples (completions are prompt-major), and per-sample rows.

    `sandbox` names the isolation level and pool size; its counters are this model's own.
    `rewards_to_score`: registered rewards scored on every sample too (`reward/<name>`).
    `answer_format`: the dataset's (DatasetArtifact.prompt), which format and answers follow.
    """
    given = sandbox or rewards.SandboxStats()
    stats = given.fresh()
    expanded = [r for r in rows for _ in range(samples)]
    fmt = [
        rewards.format_strict(c, rewards.Reference(r["answer"], answer_format=answer_format))
        for c, r in zip(completions, expanded, strict=True)
    ]
    exact, correct = correctness(expanded, completions, stats, answer_format)
    scored = extra_rewards(expanded, completions, rewards_to_score, stats, answer_format)
    per_prompt = np.asarray(correct).reshape(len(rows), samples)
    metrics = {
        "samples": float(samples),
        "exact_accuracy": float(np.mean(exact)),
        "pass@1": float(per_prompt.mean()),
        **(headroom.headroom_metrics(per_prompt) if samples > 1 else {}),
        "majority_accuracy": majority_accuracy(rows, completions, samples, answer_format),
        **applicable_means(scored),
        "sandbox_runs": float(stats.runs),
        "sandbox_failures": float(stats.failures),
        **rewards.isolation_metrics(stats),
    }
    by_domain: dict[str, dict[str, float]] = {}
    for domain in sorted({r.get("domain", "math") for r in rows}):
        idx = [i for i, r in enumerate(expanded) if r.get("domain", "math") == domain]
        by_domain[domain] = {
            "n": float(len(idx) // samples),
            "format_rate": float(np.mean([fmt[i] for i in idx])),
            "accuracy": float(np.mean([correct[i] for i in idx])),
        }
    scores = ModelScores(
        name=name,
        checkpoint_uri=uri,
        num_prompts=len(rows),
        format_rate=float(np.mean(fmt)),
        accuracy=float(np.mean(correct)),
        mean_completion_chars=float(np.mean([len(c) for c in completions])),
        metrics=metrics,
        by_domain=by_domain,
    )
    sample_rows = [
        {
            "model": name,
            "id": r["id"],
            "domain": r.get("domain", "math"),
            "answer": r["answer"],
            "completion": c,
            "format": f,
            "exact": e,
            "correct": k,
            **{key: values[i] for key, values in scored.items()},
        }
        for i, (r, c, f, e, k) in enumerate(
            zip(expanded, completions, fmt, exact, correct, strict=True)
        )
    ]
    return scores, sample_rows


REWARD_PREFIX = reports.REWARD_PREFIX  # per-sample scores of EvalConfig.rewards


def extra_rewards(
    rows: Sequence[dict[str, Any]],
    completions: Sequence[str],
    names: Sequence[str],
    stats: rewards.SandboxStats,
    answer_format: AnswerFormat = "tags",
) -> dict[str, list[float | None]]:
    """`reward/<name>` -> each completion's score under that registered reward (None: the
    reward does not apply to it)."""
    refs = _references(rows, answer_format)
    return {
        REWARD_PREFIX + name: rewards.get_reward(name).score(completions, refs, stats)
        for name in names
    }


def applicable_means(scored: dict[str, list[float | None]]) -> dict[str, float]:
    """Each reward's mean over the samples it applies to (a user's batch reward may say None:
    not applicable); a reward that applies to none has no mean."""
    means = {key: rewards.applicable_mean(values) for key, values in scored.items()}
    return {key: mean for key, mean in means.items() if mean is not None}


def _references(
    rows: Sequence[dict[str, Any]], answer_format: AnswerFormat
) -> list[rewards.Reference]:
    return rewards.row_references(rows, answer_format)


def majority_accuracy(
    rows: Sequence[dict[str, Any]],
    completions: Sequence[str],
    k: int,
    answer_format: AnswerFormat = "tags",
) -> float:
    """Share of prompts whose most frequent extracted answer equals the reference."""
    hits = 0
    for i, row in enumerate(rows):
        found = completions[i * k : (i + 1) * k]
        answers = [extract_answer(c, answer_format) for c in found]
        votes = Counter(a for a in answers if a is not None)
        if votes and rewards.answers_equal(votes.most_common(1)[0][0], row["answer"]):
            hits += 1
    return hits / len(rows) if rows else 0.0


def tagged(rows: list[dict[str, Any]], tag: str | None) -> list[dict[str, Any]]:
    """The rows whose source carries `tag` (all of them when it is None); an InputError when
    none does, naming the tags the split has."""
    if tag is None:
        return rows
    kept = [r for r in rows if r.get("tag") == tag]
    if not kept:
        found = sorted({str(r["tag"]) for r in rows if "tag" in r})
        raise InputError(
            f"eval tag {tag!r}: no row of the split carries it; its tags: {found or 'none'} "
            f"(set `tag` on a data source of that split, or another eval tag)"
        )
    return kept


def _networks(
    names: Sequence[str],
    checkpoints: dict[str, CheckpointArtifact],
    spec: ModelSpec,
    mesh: Any,
    cache_dir: str,
    finished: Callable[[str], bool] = lambda name: False,
    shared: SharedBuilds | None = None,
) -> Any:
    """Yield (name, checkpoint or None, network); LoRA policies share one base network.

    A model whose completions are all finished (`finished`) gets no network (None). The base
    network is the run's shared one when `shared` is given.
    """
    base = models.base_model(spec, mesh, cache_dir, shared, private=False)
    for name in names:
        artifact = checkpoints.get(name)
        if finished(name):
            yield name, artifact, None
            continue
        if artifact is None:
            yield name, None, base
            continue
        yield name, artifact, models.policy_network(artifact, mesh, cache_dir, shared, base)


def few_shot_prompts(
    dataset: DatasetArtifact, tokenizer: Tokenizer, prompts: Sequence[str], k: int
) -> tuple[list[str], int]:
    """`prompts` behind k worked SFT examples, and the prompt length that holds them all."""
    drop = {tokenizer.bos_id(), tokenizer.eos_id(), tokenizer.pad_id()}
    examples = fewshot.worked_examples(load_sft_arrays(dataset), k)
    shots = [fewshot.shot_text(e, tokenizer.decode, drop) for e in examples]
    shown = [fewshot.few_shot_prompt(shots, p) for p in prompts]
    longest = max(len(tokenizer.encode(p)) for p in shown) + 1  # + BOS
    return shown, -(-longest // 16) * 16


@dataclass(frozen=True)
class Variant:
    """One row of the report: a model decoded one way (k-shot, sampled or greedy)."""

    label: str
    shots: int  # worked examples before each prompt (0: zero-shot)
    config: EvalConfig  # the decoding settings of this row (greedy rows: temperature 0, 1 sample)

    def batches(self, prompts: int) -> int:
        return -(-prompts * self.config.samples // self.config.batch_size)


def _variant_labels(name: str, config: EvalConfig) -> list[Variant]:
    """The rows one model gives: itself, for the base model its k-shot variant, and with
    `config.greedy` a greedy row beside each sampled one."""
    variants = [Variant(name, 0, config)]
    if name == "base" and config.base_shots:
        variants.append(Variant(f"base-{config.base_shots}shot", config.base_shots, config))
    if config.greedy:
        greedy = config.model_copy(update={"temperature": 0.0, "samples": 1, "greedy": False})
        variants += [
            Variant(v.label + reports.GREEDY_SUFFIX, v.shots, greedy) for v in list(variants)
        ]
    return variants


def batches_to_decode(config: EvalConfig, prompts: int, copies: Mapping[str, str]) -> int:
    """The batches the progress bar counts: every row's, but a model that copies another's
    completions (`copies`: same_checkpoint_as) decodes none."""
    return sum(
        v.batches(prompts)
        for m in config.models
        if m not in copies
        for v in _variant_labels(m, config)
    )


def _variants(
    name: str,
    prompts: list[str],
    dataset: DatasetArtifact,
    tokenizer: Tokenizer,
    config: EvalConfig,
) -> list[tuple[Variant, list[str], int]]:
    """(row, its prompts each repeated for its samples, prompt length) for model `name`."""
    out = []
    for variant in _variant_labels(name, config):
        repeated = [p for p in prompts for _ in range(variant.config.samples)]
        if variant.shots:
            shown, length = few_shot_prompts(dataset, tokenizer, repeated, variant.shots)
            out.append((variant, shown, length))
        else:
            out.append((variant, repeated, dataset.prompt_len))
    return out


def _evaluate(
    directory: str,
    dataset: DatasetArtifact,
    checkpoints: dict[str, CheckpointArtifact],
    config: EvalConfig,
    spec: ModelSpec,
    mesh_spec: MeshSpec,
    sandbox: rewards.SandboxStats,
    ctx: RunContext,
) -> tuple[EvalReport, dict[str, float], dict[str, list[float]]]:
    cache_dir = ctx.model_cache
    tokenizer = build_tokenizer(spec, cache_dir, ctx.shared)
    mesh = models.build_mesh(mesh_spec)
    rows = tagged(load_prompts(dataset, config.split), config.tag)[: config.max_prompts]
    prompts = [r["prompt"] for r in rows]
    progress: dict[str, EvalProgress] = {}
    copies = same_checkpoint_as(config.models, checkpoints)
    tally = BatchTally(ctx.progress, batches_to_decode(config, len(rows), copies))

    def progress_of(label: str) -> EvalProgress:
        if label not in progress:
            progress[label] = EvalProgress(directory, label, ctx.deadline, ctx.stop, tally)
        return progress[label]

    def finished(name: str, progress_of: Callable[[str], EvalProgress]) -> bool:
        return all(
            progress_of(v.label).complete(v.batches(len(rows)))
            for v in _variant_labels(name, config)
        )

    all_scores, all_samples = [], []
    compilations: dict[str, float] = {}
    decoded: dict[tuple[str, int], list[str]] = {}  # (copied model, variant) -> completions
    with mesh:
        for name, artifact, network in _networks(
            config.models,
            checkpoints,
            spec,
            mesh,
            cache_dir,
            lambda m: m in copies or finished(m, progress_of),
            ctx.shared,
        ):
            variants = _variants(name, prompts, dataset, tokenizer, config)
            for index, (variant, inputs, length) in enumerate(variants):
                label = variant.label
                if name in copies:  # the same weights, prompts and decoding: the same outputs
                    completions = decoded[(copies[name], index)]
                    log.info("evaluated %s: %s's checkpoint, its completions", label, copies[name])
                else:
                    with counting_compilations() as compiles:
                        completions = generate(
                            network,
                            tokenizer,
                            inputs,
                            variant.config,
                            length,
                            spec,
                            progress_of(label),
                        )
                    compilations |= sampler_compilations(label, compiles)
                if name in copies.values():  # kept only for the rows that copy it
                    decoded[(name, index)] = completions
                scores, sample_rows = score(
                    label,
                    artifact.uri if artifact else None,
                    rows,
                    completions,
                    variant.config.samples,
                    sandbox,
                    config.rewards,
                    dataset.prompt.answer_format,
                )
                all_scores.append(scores)
                all_samples += sample_rows
                log.info(
                    "evaluated %s: format %.3f accuracy %.3f",
                    label,
                    scores.format_rate,
                    scores.accuracy,
                )
    all_scores = reports.with_statistics(all_scores, all_samples)
    report = reports.write_report(directory, all_scores, all_samples, checkpoints)
    if ctx.primary:  # evaluation files are records: one process (JAX process 0) writes them
        reports.record_scores(report, checkpoints, directory)
    metrics = reports.record_metrics(all_scores)
    metrics.update(rewards.isolation_metrics(sandbox))
    return report, metrics | compilations, {}


def same_checkpoint_as(
    names: Sequence[str], checkpoints: dict[str, CheckpointArtifact]
) -> dict[str, str]:
    """Each listed model whose checkpoint (URI and step) a model listed before it has -> that
    model. Its rows are the earlier model's completions, scored under its own name: a pick
    node's output is one of the policies it chose between, and decoding it again would
    repeat a sixth of reinforce-mode's held-out evaluation (200 s) for the same outputs."""
    first: dict[tuple[str, int], str] = {}
    copies: dict[str, str] = {}
    for name in names:
        artifact = checkpoints.get(name)
        if artifact is None:  # the base model
            continue
        key = (artifact.uri, artifact.step)
        if key in first:
            copies[name] = first[key]
        else:
            first[key] = name
    return copies


def sampler_compilations(label: str, compiles: CompileCounter) -> dict[str, float]:
    """`<label>/sampler_<prefill|decode>_compilations` in this session (0: read back, not
    generated; the goal is 1: one compiled shape for every batch of a model)."""
    return {
        f"{label}/sampler_{part}_compilations": float(compiles.count_of(function))
        for part, function in SAMPLER_FUNCTIONS.items()
    }


def identity(
    config: EvalConfig,
    model: ModelSpec,
    dataset_fingerprint: str,
    checkpoint_fingerprints: dict[str, str],
) -> StageIdentity:
    # split, greedy and rewards are hashed only when set (the registration's
    # hash_exempt_defaults): evaluations made before those fields existed keep their hash
    inputs = {"dataset": dataset_fingerprint, **dict(sorted(checkpoint_fingerprints.items()))}
    code = rewards.reward_sources(config.rewards)  # a user's rewards: their code
    hashed = hashed_config("evaluate", config)
    return stage_identity(
        "evaluate", STAGE_VERSION, hashed, inputs, model=model, key="eval", code=code
    )


def resolve_checkpoints(
    config: EvalConfig, given: dict[str, CheckpointArtifact]
) -> dict[str, CheckpointArtifact]:
    """The run's named checkpoints plus any listed by URI (read from their stage records)."""
    found = {name: given[name] for name in config.models if name in given}
    for name in config.models:
        if name == "base" or name in found:
            continue
        if "/" not in name:
            raise ValueError(
                f"eval.models lists {name!r} but no checkpoint was given for it; "
                f"given: {sorted(given)}"
            )
        found[name] = located_output(*find_checkpoint_record(name))  # type: ignore[assignment]
    return found


def with_saved_steps(
    config: EvalConfig,
    checkpoints: dict[str, CheckpointArtifact],
    grid: Callable[[CheckpointArtifact], int | None] | None = None,
) -> tuple[EvalConfig, dict[str, CheckpointArtifact]]:
    """With `steps: saved`, each checkpoint's earlier saved steps on its stage's save grid
    become models of their own, `<name>@step<N>`, listed before it (oldest first): the report
    compares each step with the one before it and a pick node can choose any of them.

    The grid (`grid`, by default the interval in the stage's record: save_grid) keeps the
    candidates the recipe's: a save a session's stop forced, or Orbax's save of a stage's first
    step, is left out, so where sessions ended never changes what a pick can choose, and arms
    with the same `checkpoint_every_steps` offer the same steps."""
    if config.steps == "last":
        return config, checkpoints
    grid_of = grid or save_grid
    names: list[str] = []
    expanded: dict[str, CheckpointArtifact] = {}
    for name in config.models:
        artifact = checkpoints.get(name)
        if artifact is not None:
            earlier = [step for step in saved_steps(artifact.uri) if step < artifact.step]
            every = grid_of(artifact) if earlier else None
            off_grid = [step for step in earlier if every is not None and step % every]
            if off_grid:
                log.info(
                    "%s: saved steps %s are off its %d-step grid: not scored", name, off_grid, every
                )
            for step in (step for step in earlier if step not in off_grid):
                label = f"{name}{STEP_SUFFIX}{step}"
                names.append(label)
                expanded[label] = artifact.model_copy(update={"step": step})
            expanded[name] = artifact
        names.append(name)
    return config.model_copy(update={"models": names}), expanded


def save_grid(artifact: CheckpointArtifact) -> int | None:
    """The step interval `artifact`'s stage saved on by its committed config, in the steps
    its checkpoint directories count (`checkpoint_every_steps`, times GRPO's
    `num_iterations`); None when the stage also saved on a clock (`checkpoint_every_seconds`)
    or names no interval: then every saved step is on it."""
    _, record = find_checkpoint_record(artifact.uri)
    for section in record.config.values():
        if isinstance(section, dict) and "checkpoint_every_steps" in section:
            if section.get("checkpoint_every_seconds") is not None:
                return None
            return int(section["checkpoint_every_steps"]) * int(section.get("num_iterations", 1))
    return None


@fast_paths.scoped("lora_backward", "prefill_last_position", "draw")
def evaluate(
    dataset: DatasetArtifact,
    checkpoints: dict[str, CheckpointArtifact],
    config: EvalConfig,
    model: ModelSpec,
    mesh: MeshSpec,
    ctx: RunContext,
) -> StageOutcome[EvalReport]:
    """Evaluate `config.models` ('base' needs no checkpoint; URIs are looked up)."""
    tokenizer_name = build_tokenizer(model, ctx.model_cache, ctx.shared).name
    check_dataset(dataset, tokenizer_name)
    resolved = resolve_checkpoints(config, checkpoints)
    for artifact in resolved.values():
        models.check_compatible(artifact, model, tokenizer_name)
    rewards.validate_names(dict.fromkeys(config.rewards, 1.0))
    fingerprints = {name: a.fingerprint for name, a in resolved.items()}
    sandbox = rewards.stats_for(ctx)
    scored_config, scored = with_saved_steps(config, resolved)
    return run_stage_on_artifacts(
        ctx,
        identity(config, model, dataset.fingerprint, fingerprints),
        {"dataset": dataset, **resolved},
        lambda directory: _evaluate(
            directory, dataset, scored, scored_config, model, mesh, sandbox, ctx
        ),
    )


def run(
    inputs: Mapping[str, Artifact], config: EvalConfig, ctx: RunContext
) -> StageOutcome[EvalReport]:
    """The registered entry point (stages/registry.py): `dataset`, and each checkpoint that
    `config.models` names under its input name."""
    checkpoints = {
        name: require_input(inputs, name, CheckpointArtifact)
        for name in inputs
        if name != "dataset" and name in config.models
    }
    dataset = require_input(inputs, "dataset", DatasetArtifact)
    return evaluate(dataset, checkpoints, config, ctx.require_model(), ctx.mesh, ctx)
