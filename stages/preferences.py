"""Preferences stage: (prompt, chosen, rejected) pairs for DPO / ORPO.

Entry point: `build(samples, dataset, config, ctx) -> StageOutcome[PreferenceDataset]`.

Pairs come from a file (`config.file`: json or jsonl rows of prompt / chosen / rejected, or
UltraFeedback-style rows: rated `completions`, or `chosen` / `rejected` message lists), or
from sampled completions with rewards: a GRPO stage's samples.jsonl (groups: one prompt at one
step) or an evaluation's samples.jsonl (groups: one prompt, across the evaluated models or
within `config.model`; the reward is correctness plus format, and the prompt text comes from
the split of `dataset` the evaluation scored). In each group the best-rewarded completion is
chosen against the worst when they differ by more than `config.min_margin`. With `pairing:
mode` (an evaluation with a greedy row beside the sampled one), a prompt's pair is instead a
right sample against the model's own wrong greedy answer: the pairs push the mode itself
(Iterative RPO's rejected side), not merely a bad sample. Prompts are Gemma chat turns.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from schemas.artifacts import (
    Artifact,
    CheckpointArtifact,
    DatasetArtifact,
    EvalReport,
    PreferenceDataset,
)
from schemas.recipe import PreferencesConfig
from stages.core import storage
from stages.core.datasets import evaluated_split, jsonl_bytes, load_prompts
from stages.core.errors import InputError
from stages.core.identity import SOURCE_PREFIX
from stages.core.records import find_record, record_directory
from stages.core.runner import (
    RunContext,
    StageOutcome,
    optional_input,
    run_stage_on_artifacts,
    stage_identity,
)
from stages.core.samples import mode_view, read_samples
from stages.registry import hashed_config

log = logging.getLogger(__name__)
STAGE_VERSION = 1
PAIRS_FILE = "pairs.jsonl"
GRPO_SAMPLES_FILE = "samples.jsonl"  # beside a GRPO stage's checkpoints/ (its record's directory)
CHAT_OPEN = "<start_of_turn>user\n"
CHAT_MODEL = "<end_of_turn>\n<start_of_turn>model\n"


def chat_turn(prompt: str) -> str:
    """A file's plain prompt as a Gemma user turn opening the model's turn (kept if it is one)."""
    return prompt if prompt.startswith(CHAT_OPEN) else f"{CHAT_OPEN}{prompt}{CHAT_MODEL}"


def _text(value: Any) -> str:
    """A response as text: a string, or the last message's content of a message list."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    return str(value)


def pair_from_row(row: dict[str, Any], adapter: str) -> dict[str, Any] | None:
    """One file row as a pair, or None when it has no two different responses."""
    prompt = row.get("prompt", row.get("instruction"))
    if prompt is None:
        raise InputError(
            f"preference row has no prompt or instruction field: {sorted(row)}; expected "
            f"prompt (or instruction) with chosen/rejected, or completions (ultrafeedback)"
        )
    if adapter == "ultrafeedback" and "completions" in row:
        rated = sorted(
            row["completions"], key=lambda c: float(c.get("overall_score", c.get("score", 0)))
        )
        if len(rated) < 2 or rated[0].get("overall_score") == rated[-1].get("overall_score"):
            return None
        chosen, rejected = rated[-1]["response"], rated[0]["response"]
    else:
        chosen, rejected = _text(row["chosen"]), _text(row["rejected"])
    if chosen == rejected:
        return None
    return {"prompt": chat_turn(str(prompt)), "chosen": chosen, "rejected": rejected}


def best_against_worst(
    groups: dict[Any, list[tuple[float, str]]], prompts: dict[Any, str], margin: float
) -> list[dict[str, Any]]:
    """Per group of (reward, completion): the best against the worst, if apart by > margin."""
    pairs = []
    for key in sorted(groups, key=str):
        ranked = sorted(groups[key], key=lambda item: item[0])
        (low, worst), (high, best) = ranked[0], ranked[-1]
        if high - low > margin and best != worst:
            pairs.append(
                {
                    "prompt": prompts[key],
                    "chosen": best,
                    "rejected": worst,
                    "chosen_reward": high,
                    "rejected_reward": low,
                    "group": str(key),
                }
            )
    return pairs


def _jsonl(uri: str) -> list[dict[str, Any]]:
    text = storage.read_text(uri)
    if uri.endswith(".json"):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def mode_pairs(
    samples: list[dict[str, Any]], prompts: dict[Any, str], model: str
) -> list[dict[str, Any]]:
    """For each prompt whose greedy answer is wrong and a sample right: the first right sample
    in strict format (else the first right one) against the greedy completion."""
    view = mode_view(samples, model, "preferences (pairing: mode)")
    pairs = []
    for prompt in view.wrong_mode():
        right = [r for r in view.sampled[prompt] if float(r["correct"]) == 1.0]
        chosen = next((r for r in right if float(r["format"]) == 1.0), right[0])
        rejected = view.greedy[prompt]
        if chosen["completion"] == rejected["completion"]:
            continue
        pairs.append(
            {
                "prompt": prompts[prompt],
                "chosen": chosen["completion"],
                "rejected": rejected["completion"],
                "chosen_reward": float(chosen["correct"]) + float(chosen["format"]),
                "rejected_reward": float(rejected["correct"]) + float(rejected["format"]),
                "group": prompt,
            }
        )
    return pairs


def pairs_from_evaluation(
    report: EvalReport, dataset: DatasetArtifact, config: PreferencesConfig
) -> list[dict[str, Any]]:
    scored = load_prompts(dataset, evaluated_split(report.uri))
    prompts = {r["id"]: r["prompt"] for r in scored}
    if config.pairing == "mode":
        return mode_pairs(read_samples(report), prompts, str(config.model))
    groups: dict[Any, list[tuple[float, str]]] = defaultdict(list)
    for row in read_samples(report):
        if config.model is None or row["model"] == config.model:
            reward = float(row["correct"]) + float(row["format"])
            groups[row["id"]].append((reward, row["completion"]))
    return best_against_worst(groups, prompts, config.min_margin)


def pairs_from_grpo(samples_uri: str, config: PreferencesConfig) -> list[dict[str, Any]]:
    groups: dict[Any, list[tuple[float, str]]] = defaultdict(list)
    prompts: dict[Any, str] = {}
    for row in _jsonl(samples_uri):
        key = (row["step"], row["prompt"])
        groups[key].append((float(row["reward"]), row["completion"]))
        prompts[key] = row["prompt"]
    return best_against_worst(groups, prompts, config.min_margin)


def _build(
    directory: str,
    pairs: list[dict[str, Any]],
    source: str,
    config: PreferencesConfig,
) -> tuple[PreferenceDataset, dict[str, float], dict[str, list[float]]]:
    if config.max_pairs is not None:
        pairs = pairs[: config.max_pairs]
    if not pairs:
        raise InputError(
            f"no preference pair could be made from {source}; expected rows with two different "
            f"responses (or samples whose rewards differ by at least min_margin)"
        )
    content = jsonl_bytes(pairs)
    storage.write_bytes(storage.join(directory, PAIRS_FILE), content)
    artifact = PreferenceDataset(
        uri=storage.join(directory, PAIRS_FILE),
        pairs=len(pairs),
        source=source,
        fingerprint=hashlib.sha256(content).hexdigest(),
    )
    margins = [p["chosen_reward"] - p["rejected_reward"] for p in pairs if "chosen_reward" in p]
    metrics = {"pairs": float(len(pairs))}
    if margins:
        metrics["mean_reward_margin"] = sum(margins) / len(margins)
    return artifact, metrics, {}


def _sources(
    samples: EvalReport | CheckpointArtifact | None,
    dataset: DatasetArtifact | None,
    config: PreferencesConfig,
) -> tuple[list[dict[str, Any]], str, dict[str, str], dict[str, Artifact]]:
    """(pairs, where from, identity inputs, the upstream artifacts among them)."""
    if config.file is not None:
        if samples is not None:
            raise InputError("preferences: give either config.file or a samples input, not both")
        text = storage.read_bytes(config.file)
        rows = _jsonl(config.file)
        pairs = [p for p in (pair_from_row(r, config.adapter) for r in rows) if p is not None]
        label = f"{SOURCE_PREFIX}file:{config.file}"
        return pairs, config.file, {label: hashlib.sha256(text).hexdigest()}, {}
    if isinstance(samples, EvalReport):
        if dataset is None:
            raise InputError("preferences from an evaluation need its `dataset` input (prompts)")
        pairs = pairs_from_evaluation(samples, dataset, config)
        inputs = {"samples": samples.fingerprint, "dataset": dataset.fingerprint}
        return pairs, samples.samples_uri, inputs, {"samples": samples, "dataset": dataset}
    if isinstance(samples, CheckpointArtifact):
        if config.pairing == "mode":
            raise InputError(
                "preferences pairing: mode reads an evaluation's greedy and sampled rows; "
                f"the samples input {samples.uri} is a GRPO checkpoint (give an evaluate node)"
            )
        found = find_record(samples.uri, levels=3)
        if found is None or found[1].stage != "grpo":
            raise InputError(f"preferences: {samples.uri} is not a committed GRPO checkpoint")
        samples_uri = storage.join(record_directory(found[0]), GRPO_SAMPLES_FILE)
        pairs = pairs_from_grpo(samples_uri, config)
        return pairs, samples_uri, {"samples": samples.fingerprint}, {"samples": samples}
    raise InputError("preferences need config.file or a samples input (evaluation or GRPO)")


def build(
    samples: EvalReport | CheckpointArtifact | None,
    dataset: DatasetArtifact | None,
    config: PreferencesConfig,
    ctx: RunContext,
) -> StageOutcome[PreferenceDataset]:
    """Preference pairs from a file or from sampled completions (or the committed ones)."""
    pairs, source, inputs, artifacts = _sources(samples, dataset, config)
    hashed = hashed_config("preferences", config)
    return run_stage_on_artifacts(
        ctx,
        stage_identity("preferences", STAGE_VERSION, hashed, inputs),
        artifacts,
        lambda directory: _build(directory, pairs, source, config),
    )


def run(
    inputs: Mapping[str, Artifact], config: PreferencesConfig, ctx: RunContext
) -> StageOutcome[PreferenceDataset]:
    """The registered entry point (stages/registry.py): optional `samples` (an evaluation or a
    GRPO checkpoint) and the `dataset` whose prompts they scored."""
    samples = inputs.get("samples")
    if samples is not None and not isinstance(samples, EvalReport | CheckpointArtifact):
        raise TypeError(f"input 'samples': expected an eval report or a checkpoint, got {samples}")
    return build(samples, optional_input(inputs, "dataset", DatasetArtifact), config, ctx)
