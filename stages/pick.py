"""Pick stage: the policy a run outputs is the one that did best on the validation split.

Entry point: `pick(evaluation, candidates, config, ctx) -> StageOutcome[CheckpointArtifact]`.

Align and Reinforce can make a policy worse (GRPO did on one data seed of the headroom
recipe: held-out greedy 0.336 -> 0.227), and nothing but a choice made on other prompts keeps
such a policy from being a run's output. An evaluate node scores every candidate greedily on
the `validation` split (data.validation: prompts apart from both the training splits and the
held-out eval split); this stage reads that report and outputs the chosen candidate's
checkpoint unchanged. The first candidate is the incumbent, the policy the others started
from: another is chosen only when its validation accuracy beats the incumbent's by more than
`min_gain` (and, with `max_p`, by the exact McNemar test at p <= max_p: a gain inside the
noise of a few hundred prompts keeps the incumbent), so a tie keeps the incumbent. With
`correction: holm` the p-values are Holm-adjusted over every choice but the incumbent before
they meet max_p: with 11 choices, one equally good choice would otherwise pass p <= 0.05 up
to 55 times in 100.
choice.json lists every candidate's accuracy, its wins and losses against the incumbent on
the same prompts with their p-value, and which was chosen and why;
an evaluation of the held-out split downstream scores the choice after it was made.

When that evaluation also scored the earlier saved steps of the candidates (`steps: saved`,
with training nodes keeping them: `keep_checkpoints`), every such step of a candidate other
than the incumbent is a choice of its own, `<name>@step<N>`: a run whose arm peaked before its
last step outputs the peak, not the last step.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from schemas.artifacts import GREEDY_SUFFIX, STEP_SUFFIX, Artifact, CheckpointArtifact, EvalReport
from schemas.recipe import PickConfig
from stages.core import stats, storage
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
from stages.core.samples import read_samples
from stages.registry import hashed_config

log = logging.getLogger(__name__)
STAGE_VERSION = 1
CHOICE_FILE = "choice.json"
SPLIT = "validation"


def greedy_labels(evaluation: EvalReport, candidates: list[str]) -> dict[str, str]:
    """Each candidate's greedy row label in the evaluation, which must have scored the
    validation split: `<name>` for a greedy evaluation, `<name>@greedy` beside samples."""
    found = find_record(evaluation.uri, levels=2)
    if found is None:
        raise MissingInput(f"evaluation {evaluation.uri} is not committed (no stage record)")
    config = found[1].config.get("eval", {})
    split = config.get("split", "eval")
    if split != SPLIT:
        raise InputError(
            f"pick: evaluation {evaluation.uri} scored the {split!r} split; the choice must be "
            f"made on {SPLIT!r} (evaluate config split: {SPLIT}), so the held-out eval split "
            f"scores the chosen policy only after the choice"
        )
    greedy = float(config.get("temperature", 0.0)) == 0.0
    labels = {name: name if greedy else name + GREEDY_SUFFIX for name in candidates}
    scored = {s.name for s in evaluation.scores}
    missing = sorted(label for label in labels.values() if label not in scored)
    if missing:
        raise InputError(
            f"pick: evaluation {evaluation.uri} has no greedy row {missing} (it has "
            f"{sorted(scored)}); evaluate every candidate greedily (temperature 0, or "
            f"greedy: true beside samples)"
        )
    return labels


def check_same_checkpoints(
    evaluation: EvalReport, labels: dict[str, str], candidates: dict[str, CheckpointArtifact]
) -> None:
    """The evaluation scored exactly the checkpoints given as candidates."""
    by_label = {s.name: s.checkpoint_uri for s in evaluation.scores}
    for name, label in labels.items():
        if by_label[label] != candidates[name].uri:
            raise InputError(
                f"pick: candidate {name!r} is {candidates[name].uri}, but the evaluation scored "
                f"{by_label[label]} as {label!r}; give the evaluate node the same checkpoints"
            )


def outcomes(samples: list[dict[str, Any]], label: str) -> dict[str, float]:
    """Prompt id -> correct (0/1) of one greedy row."""
    return {str(r["id"]): float(r["correct"]) for r in samples if r["model"] == label}


def choose(
    accuracy: dict[str, float],
    min_gain: float,
    p_values: dict[str, float] | None = None,
    max_p: float | None = None,
) -> str:
    """The incumbent (the first in `accuracy`), unless a choice beats it by more than
    min_gain (and, with max_p, at a McNemar p-value of at most max_p): then the most accurate
    such choice (the earlier listed on a tie)."""
    order = list(accuracy)
    incumbent = order[0]
    eligible = [
        name
        for name in order[1:]
        if accuracy[name] > accuracy[incumbent] + min_gain
        and (max_p is None or (p_values or {}).get(name, 1.0) <= max_p)
    ]
    if not eligible:
        return incumbent
    return max(eligible, key=lambda name: (accuracy[name], -order.index(name)))


def saved_step_choices(
    evaluation: EvalReport,
    labels: dict[str, str],
    candidates: dict[str, CheckpointArtifact],
) -> tuple[dict[str, str], dict[str, CheckpointArtifact]]:
    """Every choice, in order: each candidate (its committed step), followed, for all but the
    incumbent, by each earlier step the evaluation scored (`<name>@step<N>`, newest first).
    Returns (choice -> greedy row label, choice -> checkpoint at that step)."""
    scored = {s.name for s in evaluation.scores}
    incumbent = next(iter(labels))
    choice_labels: dict[str, str] = {}
    checkpoints: dict[str, CheckpointArtifact] = {}
    for name, label in labels.items():
        choice_labels[name], checkpoints[name] = label, candidates[name]
        if name == incumbent:
            continue
        suffix = label[len(name) :]  # "" or "@greedy"
        row = re.compile(re.escape(name + STEP_SUFFIX) + r"(\d+)" + re.escape(suffix))
        steps = sorted((int(m[1]) for s in scored if (m := row.fullmatch(s))), reverse=True)
        for step in steps:
            choice = f"{name}{STEP_SUFFIX}{step}"
            choice_labels[choice] = choice + suffix
            checkpoints[choice] = candidates[name].model_copy(update={"step": step})
    return choice_labels, checkpoints


def _pick(
    directory: str,
    evaluation: EvalReport,
    candidates: dict[str, CheckpointArtifact],
    config: PickConfig,
) -> tuple[CheckpointArtifact, dict[str, float], dict[str, list[float]]]:
    labels = greedy_labels(evaluation, config.candidates)
    labels, choices = saved_step_choices(evaluation, labels, candidates)
    check_same_checkpoints(evaluation, labels, choices)
    samples = read_samples(evaluation)
    correct = {name: outcomes(samples, label) for name, label in labels.items()}
    accuracy = {name: sum(c.values()) / len(c) for name, c in correct.items()}
    incumbent = config.candidates[0]
    rows = [_row(name, choices[name], correct[name], correct[incumbent]) for name in labels]
    p_values = tested_p_values(rows, incumbent, config.correction)
    chosen = choose(accuracy, config.min_gain, p_values, config.max_p)
    choice = {"chosen": chosen, "incumbent": incumbent, "min_gain": config.min_gain}
    if config.max_p is not None:
        choice["max_p"] = config.max_p
    if config.correction != "none":
        choice["correction"] = config.correction
        for row in rows:
            row["p_" + config.correction] = p_values[row["name"]]
    storage.write_text(
        storage.join(directory, CHOICE_FILE),
        json.dumps({**choice, "split": SPLIT, "candidates": rows}, indent=2, sort_keys=True),
    )
    _say(chosen, incumbent, accuracy)
    _say_noise(chosen, accuracy, p_values, config)
    metrics = {f"validation_accuracy/{name}": value for name, value in accuracy.items()}
    metrics["chosen_index"] = float(config.candidates.index(chosen.split(STEP_SUFFIX)[0]))
    metrics["chosen_step"] = float(choices[chosen].step)
    # a copy: the same object as the candidate's own output would make Prefect, which tracks
    # task results by identity, draw every later reader of that candidate as a reader of pick
    return choices[chosen].model_copy(), metrics, {}


def tested_p_values(
    rows: list[dict[str, Any]], incumbent: str, correction: str
) -> dict[str, float]:
    """Each choice's p-value against the incumbent as `max_p` tests it: its own McNemar p,
    or with `correction: holm` that p Holm-adjusted over every choice but the incumbent."""
    raw = {row["name"]: float(row["p_vs_incumbent"]) for row in rows}
    if correction == "none":
        return raw
    adjusted = stats.holm_adjusted({n: p for n, p in raw.items() if n != incumbent})
    return {**adjusted, incumbent: raw[incumbent]}


def _row(
    name: str, artifact: CheckpointArtifact, correct: dict[str, float], incumbent: dict[str, float]
) -> dict[str, Any]:
    """One candidate in choice.json: its accuracy, its wins / losses against the incumbent
    on the same prompts (McNemar's discordant pairs) and their exact two-sided p-value."""
    wins = sum(1 for p, c in correct.items() if c > incumbent.get(p, 0.0))
    losses = sum(1 for p, c in correct.items() if c < incumbent.get(p, 0.0))
    return {
        "name": name,
        "checkpoint": artifact.uri,
        "step": artifact.step,
        "prompts": len(correct),
        "accuracy": sum(correct.values()) / len(correct),
        "wins_vs_incumbent": wins,
        "losses_vs_incumbent": losses,
        "p_vs_incumbent": stats.mcnemar_exact_p(wins, losses),
    }


def _say(chosen: str, incumbent: str, accuracy: dict[str, float]) -> None:
    """INFO for the choice; WARNING for each candidate that did worse than the incumbent."""
    for name, value in accuracy.items():
        if value < accuracy[incumbent]:
            log.warning(
                "pick: %s is worse than %s on the validation split (greedy %.3f < %.3f); it is "
                "not the output",
                name,
                incumbent,
                value,
                accuracy[incumbent],
            )
    log.info(
        "pick: the output is %s (validation greedy accuracy %s)",
        chosen,
        ", ".join(f"{n} {a:.3f}" for n, a in accuracy.items()),
    )


def _say_noise(
    chosen: str, accuracy: dict[str, float], p_values: dict[str, float], config: PickConfig
) -> None:
    """INFO for each candidate more accurate than the output that max_p kept out."""
    if config.max_p is None:
        return
    for name, value in accuracy.items():
        if value > accuracy[chosen] and p_values[name] > config.max_p:
            log.info(
                "pick: %s scored %.3f on the validation split against %s's %.3f, but McNemar "
                "p = %.3g%s > max_p %g: inside the noise, not chosen",
                name,
                value,
                chosen,
                accuracy[chosen],
                p_values[name],
                "" if config.correction == "none" else f" ({config.correction}-adjusted)",
                config.max_p,
            )


def identity(
    config: PickConfig, evaluation_fingerprint: str, candidate_fingerprints: dict[str, str]
) -> StageIdentity:
    inputs = {"evaluation": evaluation_fingerprint, **dict(sorted(candidate_fingerprints.items()))}
    return stage_identity("pick", STAGE_VERSION, hashed_config("pick", config), inputs)


def pick(
    evaluation: EvalReport,
    candidates: dict[str, CheckpointArtifact],
    config: PickConfig,
    ctx: RunContext,
) -> StageOutcome[CheckpointArtifact]:
    """The candidate with the best greedy validation accuracy (the incumbent on a tie)."""
    fingerprints = {name: a.fingerprint for name, a in candidates.items()}
    return run_stage_on_artifacts(
        ctx,
        identity(config, evaluation.fingerprint, fingerprints),
        {"evaluation": evaluation, **candidates},
        lambda directory: _pick(directory, evaluation, candidates, config),
    )


def run(
    inputs: Mapping[str, Artifact], config: PickConfig, ctx: RunContext
) -> StageOutcome[CheckpointArtifact]:
    """The registered entry point (stages/registry.py): the `evaluation` of the validation
    split and each candidate checkpoint under the input name `config.candidates` lists."""
    candidates = {
        name: require_input(inputs, name, CheckpointArtifact) for name in config.candidates
    }
    return pick(require_input(inputs, "evaluation", EvalReport), candidates, config, ctx)
