"""What each stage shows in the Prefect UI: keyed artifacts built from its committed record.

The stage record on storage is the source of truth (it is what decides skips), so the UI reads
it too: a skipped stage shows the same metrics, data card, report and checkpoint links as the
run that produced them, under the same keys. Keys are `far-<run>-<id>-<stage>-<what>`, where
`<id>` is a short id of the run's URI (`run_id`), so two runs of one recipe under two storage
roots never version each other's artifacts (Prefect keys allow lowercase letters, digits and
dashes); the Artifacts page keeps one versioned history per run and stage.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)

from schemas.artifacts import CheckpointArtifact, DatasetArtifact, EvalReport
from schemas.record import StageRecord
from stages.core import storage
from stages.core.evaluations import EVALUATIONS_INDEX
from stages.core.records import read_record
from stages.core.runner import StageOutcome

REPORT_MARKDOWN = "report.md"  # written by the evaluate stage beside report.json


def run_id(run_uri: str) -> str:
    """A short id of a run's URI (its storage root and name): the first 6 hex digits of its
    SHA-256. Two runs named alike under two storage roots, sharing one Prefect server, get
    different flow run names and artifact keys; the same run gets the same id every session."""
    return hashlib.sha256(run_uri.encode()).hexdigest()[:6]


def run_label(run: str, run_uri: str) -> str:
    """`{run}-{id}`: how the Prefect UI names a run (flow runs, artifact keys)."""
    return f"{run}-{run_id(run_uri)}"


def artifact_key(run: str, stage: str, what: str) -> str:
    """A valid Prefect artifact key: lowercase, runs of other characters become one dash."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"far-{run}-{stage}-{what}".lower()).strip("-")
    if not slug:
        raise ValueError(f"no artifact key can be made from run={run!r} stage={stage!r}")
    return slug


def browsable_link(uri: str) -> str:
    """A link a browser can follow: gs:// opens the Cloud console, local paths are file://."""
    if uri.startswith("gs://"):
        return "https://console.cloud.google.com/storage/browser/" + uri.removeprefix("gs://")
    if "://" in uri:
        return uri
    return "file://" + uri


def metrics_rows(record: StageRecord, skipped: bool) -> list[dict[str, Any]]:
    """The metrics table: status and seconds first, then every scalar metric, sorted by name."""
    rows: list[dict[str, Any]] = [
        {"metric": "status", "value": "skipped (complete on storage)" if skipped else "ran"},
        {"metric": "seconds (when it ran)", "value": round(record.seconds, 2)},
    ]
    rows += [{"metric": k, "value": float(f"{v:.6g}")} for k, v in sorted(record.metrics.items())]
    return rows


def publish_stage(run: str, stage: str, outcome: StageOutcome[Any]) -> None:
    """Create the stage's artifacts in the current task run (summary, metrics and its own)."""
    record = read_record(outcome.record_uri)
    if record is None:
        raise FileNotFoundError(
            f"stage {stage} returned record {outcome.record_uri}, but no record is there"
        )
    _publish_summary(run, stage, outcome)
    create_table_artifact(
        table=metrics_rows(record, outcome.skipped),
        key=artifact_key(run, stage, "metrics"),
        description=f"FAR {run} {stage}: metrics from {outcome.record_uri}",
    )
    output = outcome.output
    if isinstance(output, DatasetArtifact):
        create_markdown_artifact(
            markdown=f"### {stage}: data card\n\n{card_markdown(output)}",
            key=artifact_key(run, stage, "data-card"),
            description=f"FAR {run}: the data card",
        )
    elif isinstance(output, CheckpointArtifact):
        create_link_artifact(
            link=browsable_link(output.uri),
            link_text=f"{stage} checkpoint, step {output.step}: {output.uri}",
            key=artifact_key(run, stage, "checkpoint"),
            description=f"FAR {run} {stage}: the Orbax checkpoint root",
        )
    elif isinstance(output, EvalReport):
        _publish_report(run, stage, output)


def publish_ledger(run: str, run_uri: str, root: str, signed: bool) -> None:
    """The run's ledger root, outside run storage: `far audit --expect-root` compares the
    chain with it, so a writer who rewrites storage cannot also rewrite what was published."""
    create_markdown_artifact(
        markdown=(
            f"### Ledger root\n\n`{root}`\n\n"
            f"{'signed (HMAC-SHA256, FAR_AUDIT_KEY)' if signed else 'not signed'}; check with "
            f"`far audit {run_uri} --expect-root {root}`"
        ),
        key=artifact_key(run, "run", "ledger"),
        description=f"FAR {run}: ledger root {root}",
    )


def _publish_summary(run: str, stage: str, outcome: StageOutcome[Any]) -> None:
    output = outcome.output
    verb = "skipped (already complete on storage)" if outcome.skipped else "ran"
    lines = [
        f"### {stage}: {verb}",
        "",
        f"- output: `{output.uri}`",
        f"- record: `{outcome.record_uri}`",
        f"- fingerprint: `{output.fingerprint}`",
    ]
    if not outcome.skipped:
        lines.append(f"- seconds: {outcome.seconds:.1f}")
    create_markdown_artifact(
        markdown="\n".join(lines),
        key=artifact_key(run, stage, "summary"),
        description=f"FAR {run} {stage}: {verb}",
    )


def _publish_report(run: str, stage: str, report: EvalReport) -> None:
    report_md = storage.join(report.uri.rsplit("/", 1)[0], REPORT_MARKDOWN)
    try:
        text = storage.read_text(report_md)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"evaluation report {report.uri} has no {REPORT_MARKDOWN} beside it ({report_md})"
        ) from e
    create_markdown_artifact(
        markdown=f"### Evaluation report\n\n{text}\n\nreport: `{report.uri}`"
        + evaluation_files_markdown(report),
        key=artifact_key(run, stage, "report"),
        description=f"FAR {run}: base vs SFT vs GRPO",
    )


def card_markdown(artifact: DatasetArtifact) -> str:
    """The data card as markdown (for Prefect artifacts and humans)."""
    card = artifact.card
    lines = [
        "| split | examples | by source | by domain (achieved / target) |",
        "|---|---:|---|---|",
    ]
    for split, size in artifact.split_sizes.items():
        target = card.target_mix.get(split, {})
        domains = ", ".join(
            f"{d} {p:.2f}" + (f" / {target[d]:.2f}" if d in target else "")
            for d, p in sorted(card.achieved_mix.get(split, {}).items())
        )
        sources = ", ".join(f"{s} {n}" for s, n in card.counts_by_source.get(split, {}).items())
        lines.append(f"| {split} | {size} | {sources} | {domains} |")
    lines += [
        "",
        f"SFT rows: {card.sft_rows} ({'packed' if card.packed else 'one example each'}),"
        f" useful tokens {card.useful_token_fraction:.1%}; quarantined "
        f"{artifact.quarantined}: {card.quarantined_by_reason or 'none'}",
    ]
    return "\n".join(lines) + "\n"


def evaluation_files_markdown(report: EvalReport) -> str:
    """The write-once evaluation files this report left beside each checkpoint's record."""
    index = storage.join(report.uri.rsplit("/", 1)[0], EVALUATIONS_INDEX)
    if not storage.exists(index):
        return ""
    lines = ["", "", "| evaluation file | sha256 |", "|---|---|"]
    lines += [
        f"| `{uri}` | `{digest}` |" for uri, digest in sorted(storage.read_json(index).items())
    ]
    return "\n".join(lines)
