"""The evaluation report: markdown tables, PNG plots, per-sample outputs, and a write-once
file of scores beside each evaluated checkpoint's stage record (records never change), or, for
a checkpoint of another run, in the evaluation's own directory."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure  # no pyplot: no global backend state

from schemas.artifacts import (
    GREEDY_SUFFIX,
    REWARD_PREFIX,
    VS_PREVIOUS,
    CheckpointArtifact,
    EvalReport,
    ModelScores,
)
from schemas.record import Evaluation
from stages.core import stats, storage
from stages.core.evaluations import EVALUATIONS_INDEX, write_evaluation, write_external_evaluation
from stages.core.records import RECORD_NAME, find_checkpoint_record, record_run, same_run
from stages.evaluate import headroom


def outcomes_by_prompt(samples: Sequence[dict[str, Any]], name: str, key: str) -> list[list[float]]:
    """One model's `key` outcomes grouped by prompt, prompts in first-seen order (a model may
    be sampled k times a prompt and another decoded greedily once)."""
    by_prompt: dict[str, list[float]] = {}
    for r in samples:
        if r["model"] == name:
            by_prompt.setdefault(str(r["id"]), []).append(float(r[key]))
    return list(by_prompt.values())


def per_prompt(samples: Sequence[dict[str, Any]], name: str, key: str) -> list[float]:
    """One model's `key` outcome of its first sample of each prompt, in prompt order."""
    return [outcomes[0] for outcomes in outcomes_by_prompt(samples, name, key)]


def previous_rows(scores: Sequence[ModelScores]) -> list[ModelScores | None]:
    """Each row's comparison partner: the nearest row before it decoded the same way (a greedy
    row with the greedy row before it, a sampled row with the sampled one), or None."""
    last: dict[bool, ModelScores] = {}
    out: list[ModelScores | None] = []
    for s in scores:
        greedy_row = s.name.endswith(GREEDY_SUFFIX)
        out.append(last.get(greedy_row))
        last[greedy_row] = s
    return out


def with_statistics(
    scores: Sequence[ModelScores], samples: Sequence[dict[str, Any]]
) -> list[ModelScores]:
    """Scores with Wilson 95% intervals of format rate and accuracy and the paired comparison
    with the row before it decoded the same way (`previous_rows`): exact McNemar on each
    prompt's first sample and, for rows sampled k > 1 times a prompt, the sign-flip test of
    the per-prompt solve rates (pass@1). The intervals count prompts, not completions: a
    prompt's k samples are correlated, so each prompt's mean is one (fractional) outcome."""
    out: list[ModelScores] = []
    for s, before in zip(scores, previous_rows(scores), strict=True):
        extra: dict[str, float] = {}
        for metric, key in (("format_rate", "format"), ("accuracy", "correct")):
            low, high = stats.rate_interval(prompt_means(samples, s.name, key))
            extra |= {f"{metric}_ci_low": low, f"{metric}_ci_high": high}
        if before is not None:
            extra |= comparison_metrics(samples, before.name, s.name)
            if _samples(before) > 1 and _samples(s) > 1:
                extra |= pass_at_1_metrics(samples, before.name, s.name)
        out.append(s.model_copy(update={"metrics": {**s.metrics, **extra}}))
    return out


def _samples(s: ModelScores) -> int:
    return int(s.metrics.get("samples", 1))


# (label, metric prefix, per-sample key): accuracy keeps the unprefixed names it always had
PAIRED_OUTCOMES = (("accuracy", "", "correct"), ("format", "format_", "format"))
PASS_AT_1 = "pass@1_"  # metric prefix of the sampled rows' paired solve-rate comparison


def comparison_metrics(
    samples: Sequence[dict[str, Any]], before: str, name: str
) -> dict[str, float]:
    """`name` against `before` on the same prompts, exact McNemar, for accuracy and format."""
    extra: dict[str, float] = {}
    for _, prefix, key in PAIRED_OUTCOMES:
        paired = stats.paired_comparison(
            before, per_prompt(samples, before, key), name, per_prompt(samples, name, key)
        )
        extra |= {
            f"{VS_PREVIOUS}/{prefix}difference": paired.difference,
            f"{VS_PREVIOUS}/{prefix}only_this_right": float(paired.candidate_only),
            f"{VS_PREVIOUS}/{prefix}only_previous_right": float(paired.baseline_only),
            f"{VS_PREVIOUS}/{prefix}p_value": paired.p_value,
        }
    return extra


def prompt_means(samples: Sequence[dict[str, Any]], name: str, key: str) -> list[float]:
    """One model's mean `key` outcome per prompt, prompts in first-seen order."""
    return [sum(v) / len(v) for v in outcomes_by_prompt(samples, name, key)]


def pass_at_1_metrics(
    samples: Sequence[dict[str, Any]], before: str, name: str
) -> dict[str, float]:
    """`name` against `before`, both sampled: each prompt's solve rate, paired sign-flip test."""
    before_rates, rates = (
        np.asarray(outcomes_by_prompt(samples, model, "correct")) for model in (before, name)
    )
    paired = stats.paired_rates(before_rates, rates)
    prefix = f"{VS_PREVIOUS}/{PASS_AT_1}"
    return {
        f"{prefix}difference": paired.difference,
        f"{prefix}ci_low": paired.ci_low,
        f"{prefix}ci_high": paired.ci_high,
        f"{prefix}prompts_up": float(paired.prompts_up),
        f"{prefix}prompts_down": float(paired.prompts_down),
        f"{prefix}p_value": paired.p_value,
    }


def record_metrics(scores: Sequence[ModelScores]) -> dict[str, float]:
    """The evaluation record's metrics: each model's rates, intervals and comparison."""
    keys = ("format_rate_ci_low", "format_rate_ci_high", "accuracy_ci_low", "accuracy_ci_high")
    metrics: dict[str, float] = {}
    for s in scores:
        metrics |= {f"{s.name}/format_rate": s.format_rate, f"{s.name}/accuracy": s.accuracy}
        metrics |= {f"{s.name}/{k}": s.metrics[k] for k in keys if k in s.metrics}
        metrics |= {
            f"{s.name}/{k}": v for k, v in s.metrics.items() if k.startswith(VS_PREVIOUS + "/")
        }
    return metrics


def _interval(s: ModelScores, metric: str) -> str:
    low, high = s.metrics.get(f"{metric}_ci_low"), s.metrics.get(f"{metric}_ci_high")
    value = getattr(s, metric)
    return f"{value:.3f}" if low is None else f"{value:.3f} [{low:.2f}, {high:.2f}]"


def comparison_table(scores: Sequence[ModelScores]) -> str:
    """Each row against the row before it decoded the same way, on the same prompts: accuracy
    and format rate by exact McNemar ("right" for format: the completion met the strict
    format), and for sampled rows pass@1 by the paired sign-flip test of solve rates."""
    lines = [
        "| model | vs | metric | change | prompts this better | prompts previous better | p |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for s, before in zip(scores, previous_rows(scores), strict=True):
        if before is None:
            continue
        m = s.metrics
        for label, prefix, _ in PAIRED_OUTCOMES:
            if f"{VS_PREVIOUS}/{prefix}p_value" not in m:
                continue
            lines.append(
                f"| {s.name} | {before.name} | {label} | "
                f"{m[f'{VS_PREVIOUS}/{prefix}difference']:+.3f} | "
                f"{m[f'{VS_PREVIOUS}/{prefix}only_this_right']:.0f} | "
                f"{m[f'{VS_PREVIOUS}/{prefix}only_previous_right']:.0f} | "
                f"{m[f'{VS_PREVIOUS}/{prefix}p_value']:.3g} |"
            )
        lines += _pass_at_1_row(s, before)
    note = (
        "\nRates with Wilson 95% intervals. accuracy and format: exact McNemar on each prompt's"
        " first completion (prompts right only under this model, only under the previous one)."
        " pass@1: the mean over each prompt's samples, with the 95% interval of the change and"
        " a paired sign-flip test of the per-prompt solve rates (prompts solved more often"
        " under this model, under the previous one). A change whose p-value is above 0.05 is"
        " within the noise of this many prompts.\n"
    )
    return "\n".join(lines) + "\n" + note


def _pass_at_1_row(s: ModelScores, before: ModelScores) -> list[str]:
    prefix = f"{VS_PREVIOUS}/{PASS_AT_1}"
    m = s.metrics
    if f"{prefix}p_value" not in m:
        return []
    return [
        f"| {s.name} | {before.name} | pass@1 ({_samples(s)} samples) | "
        f"{m[f'{prefix}difference']:+.3f} [{m[f'{prefix}ci_low']:+.3f}, "
        f"{m[f'{prefix}ci_high']:+.3f}] | {m[f'{prefix}prompts_up']:.0f} | "
        f"{m[f'{prefix}prompts_down']:.0f} | {m[f'{prefix}p_value']:.3g} |"
    ]


def headroom_section(scores: Sequence[ModelScores]) -> str:
    """The headroom table of every sampled model (with its greedy row's accuracy when the
    evaluation decoded it greedily too), or nothing when no model was sampled."""
    by_name = {s.name: s for s in scores}
    rows = []
    for s in scores:
        n = int(s.metrics.get("samples", 1))
        if n < 2:
            continue
        greedy = by_name.get(s.name + GREEDY_SUFFIX)
        rows.append((s.name, n, s.metrics, None if greedy is None else greedy.accuracy))
    if not rows:
        return ""
    return "\n## Headroom\n\n" + headroom.headroom_table(rows)


def markdown_table(scores: Sequence[ModelScores]) -> str:
    """Base vs SFT vs GRPO (and any other model) overall, with a column per reward the
    evaluation also scored (`reward/<name>`, its mean), then per domain."""
    extra = sorted({k for s in scores for k in s.metrics if k.startswith(REWARD_PREFIX)})
    lines = [
        "| model | prompts | format rate [95% CI] | accuracy [95% CI] | exact | pass@1 | "
        "majority | mean completion chars |" + "".join(f" {k} |" for k in extra),
        "|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(extra),
    ]
    for s in scores:
        m = s.metrics
        lines.append(
            f"| {s.name} | {s.num_prompts} | {_interval(s, 'format_rate')} | "
            f"{_interval(s, 'accuracy')} | "
            f"{m.get('exact_accuracy', float('nan')):.3f} | {m.get('pass@1', float('nan')):.3f}"
            f" | {m.get('majority_accuracy', float('nan')):.3f} | {s.mean_completion_chars:.1f} |"
            + "".join(f" {m.get(k, float('nan')):.3f} |" for k in extra)
        )
    domains = sorted({d for s in scores for d in s.by_domain})
    if domains:
        lines += [
            "",
            "| model | " + " | ".join(f"{d} format / accuracy" for d in domains) + " |",
            "|---|" + "---:|" * len(domains),
        ]
        for s in scores:
            cells = [
                f"{s.by_domain[d]['format_rate']:.2f} / {s.by_domain[d]['accuracy']:.2f}"
                if d in s.by_domain
                else "-"
                for d in domains
            ]
            lines.append(f"| {s.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def metrics_plot(scores: Sequence[ModelScores]) -> bytes:
    figure = Figure(figsize=(6, 3.5))
    axes = figure.add_subplot()
    names = [s.name.rsplit("/", 2)[-2] if "/" in s.name else s.name for s in scores]
    width = 0.38
    for offset, (label, values) in enumerate(
        (
            ("format rate", [s.format_rate for s in scores]),
            ("accuracy", [s.accuracy for s in scores]),
        )
    ):
        positions = [i + (offset - 0.5) * width for i in range(len(scores))]
        axes.bar(positions, values, width, label=label)
    axes.set_xticks(range(len(scores)), names)
    axes.set_ylim(0, 1.05)
    axes.set_title("evaluation")
    axes.legend()
    return _png(figure)


# Tunix's aggregate reward series: not one reward's mean
_REWARD_AGGREGATES = ("rewards/sum", "rewards/mean", "rewards/min", "rewards/max")


def training_panels(
    histories: dict[str, dict[str, list[float]]],
) -> list[tuple[str, list[str], str | None]]:
    """(title, series, band) per panel: one quantity per panel, each on its own scale.

    `band` names a series pair "low|high" drawn as the spread around the first series."""
    panels: list[tuple[str, list[str], str | None]] = [
        ("sft: loss", ["sft:loss"], None),
        ("sft: learning rate", ["sft:learning_rate"], None),
        (
            "grpo: reward (mean, min-max)",
            ["grpo:rewards/mean"],
            "grpo:rewards/min|grpo:rewards/max",
        ),
    ]
    grpo = histories.get("grpo", {})
    each = sorted(
        n
        for n in grpo
        if n.startswith("rewards/") and n not in _REWARD_AGGREGATES and "/score/" not in n
    )
    panels += [
        ("grpo: each reward's mean", [f"grpo:{n}" for n in each], None),
        ("grpo: KL to the reference", ["grpo:kl"], None),
        (
            "grpo: zero-variance groups, strict format",
            ["grpo:far/zero_variance_groups", "grpo:far/format_rate"],
            None,
        ),
        (
            "grpo: completion length (tokens)",
            ["grpo:completions/mean_length", "grpo:completions/max_length"],
            None,
        ),
    ]

    def present(key: str) -> bool:
        stage, name = key.split(":", 1)
        return bool(histories.get(stage, {}).get(name))

    return [
        (title, [k for k in series if present(k)], band)
        for title, series, band in panels
        if any(present(k) for k in series)
    ]


def training_plot(histories: dict[str, dict[str, list[float]]]) -> bytes:
    """SFT loss and learning rate; GRPO reward with its spread, each reward, KL,
    zero-variance groups and format rate, completion length: each in its own panel."""
    panels = training_panels(histories)
    columns = 3
    rows = max(1, -(-len(panels) // columns))
    figure = Figure(figsize=(4.2 * columns, 2.8 * rows))

    def values(key: str) -> list[float]:
        stage, name = key.split(":", 1)
        return histories[stage][name]

    for i, (title, series, band) in enumerate(panels, start=1):
        axes = figure.add_subplot(rows, columns, i)
        for key in series:
            ys = values(key)
            axes.plot(range(1, len(ys) + 1), ys, label=key.split(":", 1)[1])
        if band:
            low, high = (values(k) for k in band.split("|"))
            axes.fill_between(range(1, len(low) + 1), low, high, alpha=0.25, label="min-max")
        axes.set_title(title, fontsize=9)
        axes.set_xlabel("step", fontsize=8)
        axes.tick_params(labelsize=7)
        if len(series) > 1 or band:
            axes.legend(fontsize=6)
    if not panels:
        figure.add_subplot().set_title("(no training curves)")
    figure.tight_layout()
    return _png(figure)


def write_report(
    directory: str,
    scores: list[ModelScores],
    samples: list[dict[str, Any]],
    checkpoints: dict[str, CheckpointArtifact],
) -> EvalReport:
    samples_bytes = "".join(json.dumps(s, sort_keys=True) + "\n" for s in samples).encode()
    samples_uri = storage.join(directory, "samples.jsonl")
    storage.write_bytes(samples_uri, samples_bytes)
    storage.write_text(
        storage.join(directory, "report.md"),
        markdown_table(scores) + "\n" + comparison_table(scores) + headroom_section(scores),
    )
    storage.write_bytes(storage.join(directory, "metrics.png"), metrics_plot(scores))
    histories = {name: find_checkpoint_record(a.uri)[1].history for name, a in checkpoints.items()}
    storage.write_bytes(storage.join(directory, "training.png"), training_plot(histories))
    report_uri = storage.join(directory, "report.json")
    report = EvalReport(
        uri=report_uri,
        samples_uri=samples_uri,
        scores=scores,
        fingerprint=hashlib.sha256(samples_bytes).hexdigest(),
    )
    storage.write_json(report_uri, report.model_dump(mode="json"))
    return report


def record_scores(
    report: EvalReport, checkpoints: dict[str, CheckpointArtifact], directory: str
) -> dict[str, str]:
    """Write each evaluated checkpoint's scores to its own file beside the checkpoint's record,
    and list those files with their sha256 in this evaluation's directory (so they are
    committed with this stage's record and `far audit` verifies them).

    A checkpoint of another run gets its file in this evaluation's own directory instead
    (evaluations.write_external_evaluation): a run never writes inside another run."""
    by_uri = {s.checkpoint_uri: s for s in report.scores if s.checkpoint_uri}
    run_uri = record_run(storage.join(directory, RECORD_NAME))
    written = {}
    for uri in dict.fromkeys(a.uri for a in checkpoints.values()):  # its steps: one file
        scores = by_uri.get(uri)
        if scores is None:
            continue
        record_uri, _ = find_checkpoint_record(uri)
        evaluation = Evaluation(
            evaluation=directory,
            checkpoint_uri=uri,
            report_uri=report.uri,
            scores=scores.model_dump(mode="json"),
        )
        if not same_run(record_uri, run_uri):
            write_external_evaluation(directory, record_uri, evaluation)
            continue
        uri, digest = write_evaluation(record_uri, evaluation)
        written[uri] = digest
    storage.write_json(storage.join(directory, EVALUATIONS_INDEX), written)
    return written
