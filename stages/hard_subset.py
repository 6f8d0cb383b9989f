"""Hard-subset stage: the training prompts an evaluation says a model still fails (or, with a
band, solves only sometimes), as a new dataset.

Entry point: `select(evaluation, dataset, config, ctx) -> StageOutcome[DatasetArtifact]`.

The evaluation must have scored the dataset's `grpo_train` split (an evaluate node with
`split: grpo_train`): the hard prompts are training prompts, and the held-out `eval` split is
never trained on, so a later evaluation on it stays held out. An evaluation of the eval split
is refused. From the evaluation's per-sample results (samples.jsonl: model, id, correct), the
prompts whose mean correctness for `config.model` is below `config.below` (and above
`config.above` when set: the informative band, DAPO's dynamic sampling done from a measured
solve rate) are kept, topped up with the others nearest the band to `config.min_prompts`, in
the dataset's own format: their
rows become `grpo_train`, the dataset's `eval` split is carried over unchanged, and
selection.jsonl lists every evaluated prompt with its score and whether it was kept. A
continued GRPO node trains on it in a later session. With `gold_sft`, the kept prompts' gold
targets (data_prep's `gold_targets`) also become the `sft_train` split, tokenized as data_prep
writes its sft rows: continued SFT on the same prompts as GRPO, the fair control of a
Reinforce arm. No training happens here.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from schemas.artifacts import Artifact, DatasetArtifact, EvalReport
from schemas.recipe import HardSubsetConfig
from stages.core.datasets import (
    evaluated_split,
    jsonl_bytes,
    load_prompts,
    pad_rows,
    write_derived_dataset,
)
from stages.core.errors import InputError, MissingInput
from stages.core.records import find_record
from stages.core.runner import (
    RunContext,
    StageIdentity,
    StageOutcome,
    require_input,
    run_stage_on_artifacts,
    stage_identity,
)
from stages.core.samples import ModeView, mode_view, read_samples
from stages.modeling.tokenizers import Tokenizer, build_tokenizer
from stages.registry import hashed_config

log = logging.getLogger(__name__)
STAGE_VERSION = 2  # 2: selects from the evaluated grpo_train split, never from eval
SELECTION_FILE = "selection.jsonl"
TRAINING_SPLIT = "grpo_train"  # the split an evaluation must have scored


def prompt_scores(
    samples: list[dict[str, object]], model: str, by: str = "correct"
) -> dict[str, float]:
    """Mean outcome `by` (correctness, or a reward the evaluation scored) per prompt id of one
    evaluated model."""
    per_prompt: dict[str, list[float]] = defaultdict(list)
    for row in samples:
        if row["model"] != model:
            continue
        if by not in row:
            scored = sorted(k for k in row if k.startswith("reward/"))
            raise InputError(
                f"hard_subset.by: the evaluation's samples have no outcome {by!r} (its "
                f"rewards: {scored}); list the reward in the evaluate node's config.rewards"
            )
        per_prompt[str(row["id"])].append(float(row[by]))  # type: ignore[arg-type]
    if not per_prompt:
        models = sorted({str(r["model"]) for r in samples})
        raise InputError(
            f"hard_subset.model: the evaluation has no samples of model {model!r}; "
            f"it has {models} (set model to one of them)"
        )
    return {prompt: sum(v) / len(v) for prompt, v in per_prompt.items()}


def in_band(score: float, config: HardSubsetConfig) -> bool:
    """Below `below` and, when set, above `above`."""
    return score < config.below and (config.above is None or score > config.above)


def distance_to_band(score: float, config: HardSubsetConfig) -> float:
    """How far a score lies outside (above, below); 0 inside. Without `above`, the score
    itself, so the top-up takes the lowest-scoring prompts first."""
    if config.above is None:
        return score
    return max(0.0, config.above - score, score - config.below)


def hard_ids(scores: dict[str, float], config: HardSubsetConfig) -> list[str]:
    """Ids in the band, topped up with the others nearest it to min_prompts."""
    ranked = sorted(
        scores,
        key=lambda p: (
            not in_band(scores[p], config),
            distance_to_band(scores[p], config),
            scores[p],
            p,
        ),
    )
    chosen = [p for p in ranked if in_band(scores[p], config)]
    if len(chosen) < config.min_prompts:
        if len(scores) < config.min_prompts:
            raise InputError(
                f"hard_subset min_prompts is {config.min_prompts} but the evaluation "
                f"scored only {len(scores)} prompts"
            )
        chosen = ranked[: config.min_prompts]
    return chosen


def mode_ids(view: ModeView, config: HardSubsetConfig) -> list[str]:
    """The wrong-mode prompts (greedy wrong, some sample right), plus `right_share` of the kept
    set from the greedy-right prompts the samples solve least often; topped up to
    `min_prompts` from the rest, least-solved greedy-right first, with a warning."""
    wrong = view.wrong_mode()
    right = sorted(
        (p for p in view.greedy if view.greedy_right(p)), key=lambda p: (view.solve_rate(p), p)
    )
    share = config.right_share
    chosen = wrong + right[: round(len(wrong) * share / (1 - share))]
    if not wrong:
        raise InputError(
            f"hard_subset (select: mode): none of the {len(view.greedy)} prompts has a wrong "
            f"greedy answer that a sample of {config.model!r} solves, so there is no mode to "
            f"move; evaluate with more samples, or use select: rate"
        )
    if len(chosen) < config.min_prompts:
        if len(view.greedy) < config.min_prompts:
            raise InputError(
                f"hard_subset min_prompts is {config.min_prompts} but the evaluation "
                f"scored only {len(view.greedy)} prompts"
            )
        rest = [p for p in right + sorted(view.greedy) if p not in chosen]
        topped = list(dict.fromkeys(rest))[: config.min_prompts - len(chosen)]
        log.warning(
            "hard_subset: %d wrong-mode prompts; topped up with %d others to min_prompts %d",
            len(wrong),
            len(topped),
            config.min_prompts,
        )
        chosen += topped
    return chosen


def chosen_ids(
    samples: list[dict[str, object]], config: HardSubsetConfig
) -> tuple[list[str], dict[str, float], dict[str, bool]]:
    """The kept prompt ids, every evaluated prompt's score (its solve rate) and, selecting by
    the mode, whether its greedy answer is right."""
    if config.select == "mode":
        view = mode_view(samples, config.model, "hard_subset (select: mode)")
        scores = {p: view.solve_rate(p) for p in view.greedy}
        return mode_ids(view, config), scores, {p: view.greedy_right(p) for p in view.greedy}
    scores = prompt_scores(samples, config.model, config.by)
    return hard_ids(scores, config), scores, {}


def gold_sequence(prompt: str, target: str, tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """(tokens, loss mask) of a prompt and its gold target, as data_prep writes an sft row:
    BOS and the chat prompt 0, the target (which closes the turn) and EOS 1."""
    head = [tokenizer.bos_id(), *tokenizer.encode(prompt)]
    response = [*tokenizer.encode(target), tokenizer.eos_id()]
    return head + response, [0] * len(head) + [1] * len(response)


def gold_arrays(
    kept: list[dict[str, Any]], dataset: DatasetArtifact, ctx: RunContext
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The kept prompts' gold targets as sft_train arrays (those within the dataset's seq_len),
    and how many rows were written and left out."""
    missing = [r["id"] for r in kept if "target" not in r]
    if missing:
        raise InputError(
            f"hard_subset.gold_sft: {len(missing)} grpo_train rows of {dataset.uri} carry no "
            f"gold target (e.g. {missing[:3]}); set data.gold_targets: true in the recipe"
        )
    tokenizer = build_tokenizer(ctx.require_model(), ctx.model_cache, ctx.shared)
    sequences = [gold_sequence(r["prompt"], r["target"], tokenizer) for r in kept]
    fitting = [q for q in sequences if len(q[0]) <= dataset.seq_len]
    if not fitting:
        raise InputError(
            f"hard_subset.gold_sft: none of the {len(kept)} kept prompts' gold rows fits the "
            f"dataset's seq_len {dataset.seq_len}; raise data.max_seq_len"
        )
    arrays = pad_rows(fitting, dataset.seq_len, tokenizer.pad_id())
    left_out = len(sequences) - len(fitting)
    return arrays, {"gold_rows": float(len(fitting)), "gold_rows_too_long": float(left_out)}


def _select(
    directory: str,
    evaluation: EvalReport,
    dataset: DatasetArtifact,
    config: HardSubsetConfig,
    ctx: RunContext | None = None,
) -> tuple[DatasetArtifact, dict[str, float], dict[str, list[float]]]:
    ids, scores, greedy_right = chosen_ids(read_samples(evaluation), config)
    chosen = set(ids)
    rows = load_prompts(dataset, TRAINING_SPLIT)
    held_out = load_prompts(dataset, "eval")
    kept = [r for r in rows if r["id"] in chosen]
    check_held_out(kept, held_out)
    gold: dict[str, np.ndarray] | None = None
    gold_metrics: dict[str, float] = {}
    if config.gold_sft:
        if ctx is None:
            raise ValueError("hard_subset.gold_sft tokenizes the gold rows: it needs the run's ctx")
        gold, gold_metrics = gold_arrays(kept, dataset, ctx)
    selection = [
        {"id": r["id"], "score": scores.get(r["id"]), "kept": r["id"] in chosen}
        | ({"greedy_correct": greedy_right[r["id"]]} if r["id"] in greedy_right else {})
        for r in rows
    ]
    artifact = write_derived_dataset(
        directory,
        dataset,
        {"grpo_train": kept, "eval": held_out},
        gold,
        extra_files={SELECTION_FILE: jsonl_bytes(selection)},
    )
    failed = sum(1 for s in scores.values() if s < config.below)
    banded = sum(1 for s in scores.values() if in_band(s, config))
    mode: dict[str, float] = {}
    if config.select == "mode":
        right = sum(greedy_right[i] for i in chosen)
        mode = {"prompts_greedy_wrong_kept": float(len(chosen) - right)}
        log.info(
            "hard_subset (select: mode): %d of %d prompts kept, %d whose greedy answer is "
            "wrong (a sample solves %d of them) and %d greedy-right",
            len(kept),
            len(rows),
            len(chosen) - right,
            sum(1 for i in chosen if not greedy_right[i] and scores[i] > 0),
            right,
        )
    else:
        log_selection(len(kept), len(rows), failed, banded, config)
    metrics = {
        **mode,
        **gold_metrics,
        "prompts_evaluated": float(len(scores)),
        "prompts_kept": float(len(kept)),
        "prompts_below_threshold": float(failed),
        "prompts_in_band": float(banded),
        "mean_score_kept": sum(scores[i] for i in chosen) / len(chosen),
    }
    return artifact, metrics, {}


def log_selection(kept: int, rows: int, failed: int, banded: int, config: HardSubsetConfig) -> None:
    """The selection in one line; a WARNING when no prompt is in the band: the kept ones
    (topped up to min_prompts) are solved always or never, so GRPO gets no gradient from them."""
    log.info(
        "hard_subset: %d of %d prompts kept (%d under %.2f, %d in the band)",
        kept,
        rows,
        failed,
        config.below,
        banded,
    )
    if banded == 0:
        log.warning(
            "hard_subset: no prompt in the band (solve rate %s); kept the %d nearest it to "
            "reach min_prompts, whose GRPO groups have equal rewards and give no gradient: "
            "widen the band (above/below), or evaluate with more samples or a weaker model",
            f"above {config.above} and below {config.below}"
            if config.above is not None
            else f"below {config.below}",
            kept,
        )


def identity(
    config: HardSubsetConfig, evaluation_fingerprint: str, dataset_fingerprint: str
) -> StageIdentity:
    # `above` and `by` are hashed only when set (the registration's hash_exempt_defaults):
    # subsets made before those fields existed keep their hash and directory
    inputs = {"evaluation": evaluation_fingerprint, "dataset": dataset_fingerprint}
    return stage_identity(
        "hard_subset", STAGE_VERSION, hashed_config("hard_subset", config), inputs
    )


def check_evaluated_on(evaluation: EvalReport, dataset: DatasetArtifact) -> None:
    """Refuse an evaluation that was not run on `dataset`'s grpo_train split (its ids would
    not match, or the hard prompts would be held-out ones)."""
    found = find_record(evaluation.uri, levels=2)
    if found is None:
        raise MissingInput(
            f"evaluation {evaluation.uri} is not committed (no stage record); expected the "
            f"output of an evaluate node"
        )
    evaluated = found[1].inputs.get("dataset")
    if evaluated != dataset.fingerprint:
        raise InputError(
            f"evaluation {evaluation.uri} ran on dataset {str(evaluated)[:12]}, "
            f"not on the given dataset {dataset.fingerprint[:12]} ({dataset.uri})"
        )
    split = evaluated_split(evaluation.uri)
    if split != TRAINING_SPLIT:
        raise InputError(
            f"evaluation {evaluation.uri} scored the {split!r} split; hard_subset needs an "
            f"evaluation of {TRAINING_SPLIT!r} (evaluate config split: {TRAINING_SPLIT}) so the "
            f"held-out eval split is never trained on"
        )


def check_held_out(kept: list[dict[str, object]], held_out: list[dict[str, object]]) -> None:
    """Refuse hard prompts that are also eval prompts (a dataset whose splits overlap)."""
    shared = sorted({str(r["id"]) for r in kept} & {str(r["id"]) for r in held_out})
    if shared:
        raise InputError(
            f"hard_subset: {len(shared)} hard prompts are also in the eval split "
            f"(e.g. {shared[:3]}); the dataset's grpo_train and eval splits must be disjoint"
        )


def select(
    evaluation: EvalReport, dataset: DatasetArtifact, config: HardSubsetConfig, ctx: RunContext
) -> StageOutcome[DatasetArtifact]:
    """The prompts of `dataset`'s grpo_train split that `evaluation` says are still hard."""
    check_evaluated_on(evaluation, dataset)
    return run_stage_on_artifacts(
        ctx,
        identity(config, evaluation.fingerprint, dataset.fingerprint),
        {"evaluation": evaluation, "dataset": dataset},
        lambda directory: _select(directory, evaluation, dataset, config, ctx),
    )


def run(
    inputs: Mapping[str, Artifact], config: HardSubsetConfig, ctx: RunContext
) -> StageOutcome[DatasetArtifact]:
    """The registered entry point (stages/registry.py): the `evaluation` and its `dataset`."""
    evaluation = require_input(inputs, "evaluation", EvalReport)
    return select(evaluation, require_input(inputs, "dataset", DatasetArtifact), config, ctx)
