"""The evaluation report: markdown tables, PNG plots, per-sample outputs, and a write-once
file of scores beside each evaluated checkpoint's stage record (records never change)."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure  # no pyplot: no global backend state

from schemas.artifacts import CheckpointArtifact, EvalReport, ModelScores
from schemas.record import Evaluation
from stages.core import storage
from stages.core.runner import EVALUATIONS_INDEX, find_checkpoint_record, write_evaluation


def markdown_table(scores: Sequence[ModelScores]) -> str:
    """Base vs SFT vs GRPO (and any other model) overall, then per domain."""
    lines = [
        "| model | prompts | format rate | accuracy | exact | pass@1 | majority | "
        "mean completion chars |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in scores:
        m = s.metrics
        lines.append(
            f"| {s.name} | {s.num_prompts} | {s.format_rate:.3f} | {s.accuracy:.3f} | "
            f"{m.get('exact_accuracy', float('nan')):.3f} | {m.get('pass@1', float('nan')):.3f}"
            f" | {m.get('majority_accuracy', float('nan')):.3f} | {s.mean_completion_chars:.1f} |"
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


def training_plot(histories: dict[str, dict[str, list[float]]]) -> bytes:
    """One panel per stage: its per-step curves (SFT loss, GRPO rewards)."""
    figure = Figure(figsize=(10, 3.5))
    stages = [s for s, h in histories.items() if h] or ["(no training curves)"]
    for i, stage in enumerate(stages, start=1):
        axes = figure.add_subplot(1, len(stages), i)
        for name, values in sorted(histories.get(stage, {}).items()):
            # rewards, rates, KL, loss; not step counters or token lengths (other scales)
            if name not in ("learning_rate", "global_step") and not name.startswith("completions/"):
                axes.plot(range(1, len(values) + 1), values, label=name)
        axes.set_title(stage)
        axes.set_xlabel("step")
        if histories.get(stage):
            axes.legend(fontsize=7)
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
    storage.write_text(storage.join(directory, "report.md"), markdown_table(scores))
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
    committed with this stage's record and `far audit` verifies them)."""
    by_uri = {s.checkpoint_uri: s for s in report.scores if s.checkpoint_uri}
    written = {}
    for artifact in checkpoints.values():
        scores = by_uri.get(artifact.uri)
        if scores is None:
            continue
        record_uri, _ = find_checkpoint_record(artifact.uri)
        evaluation = Evaluation(
            evaluation=directory,
            checkpoint_uri=artifact.uri,
            report_uri=report.uri,
            scores=scores.model_dump(mode="json"),
        )
        uri, digest = write_evaluation(record_uri, evaluation)
        written[uri] = digest
    storage.write_json(storage.join(directory, EVALUATIONS_INDEX), written)
    return written
