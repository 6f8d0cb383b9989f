"""What `far run` prints at the end, for a person at a terminal of 100 columns.

One titled block: the run's state, each stage's line (its output relative to the run), the
flow's time split, the last evaluation as one table (format rate and accuracy with their 95%
intervals, and each model against the one before it), the ledger root, and the commands a
person runs next (export, audit with the root, the UI). The full reports stay in each
evaluation's report.md, which the block names.
"""

from __future__ import annotations

import os
import textwrap

from schemas.artifacts import REWARD_PREFIX, VS_PREVIOUS, EvalReport, ModelScores
from schemas.record import RunSummary, StageSummary
from stages.core import storage

WIDTH = 100  # what the block fits, line by line (an output path too long is shortened)


def summary_lines(
    summary: RunSummary, environ: dict[str, str] | None = None, note: str = ""
) -> list[str]:
    """The block's lines: the title, the stages (and `note` on them), the evaluation, the
    root, what next. `environ` tells where the Prefect UI is (default: this process's)."""
    lines = [_title(summary), *_stage_lines(summary), _flow_line(summary)]
    lines += [f"  {line}" for line in textwrap.wrap(note, WIDTH - 2)]
    report = _last_report(summary.stages)
    if report is not None:
        lines += ["", *evaluation_lines(report, summary.run_uri)]
    if summary.ledger_root:
        lines += ["", f"  ledger root {summary.ledger_root}"]
    lines += ["", *next_lines(summary, dict(os.environ) if environ is None else environ)]
    return lines


def _title(summary: RunSummary) -> str:
    state = "complete" if summary.complete else f"INCOMPLETE ({summary.stopped_reason})"
    if summary.no_progress:
        state = f"INCOMPLETE, NO PROGRESS ({summary.stopped_reason})"
    return f"\nFAR run '{summary.run}' at {summary.run_uri}: {state}"


def _stage_lines(summary: RunSummary) -> list[str]:
    lines = []
    width = max([10, *(len(s.stage) for s in summary.stages)])  # node ids line up
    for s in summary.stages:
        took = "skipped (already complete)" if s.skipped else f"ran in {s.seconds:.1f} s"
        line = f"  {s.stage:<{width}} {took:<27} {relative(s.output_uri, summary.run_uri)}"
        lines.append(line if len(line) <= WIDTH else line[: WIDTH - 3] + "...")
    return lines


def _flow_line(summary: RunSummary) -> str:
    ran = sum(s.seconds for s in summary.stages)
    overhead = summary.seconds - ran
    share = f" ({100 * overhead / summary.seconds:.1f}%)" if summary.seconds else ""
    split = f"stages {ran:.1f} s + orchestration {overhead:.1f} s{share}"
    return f"  flow {summary.seconds:.1f} s = {split}"


def relative(uri: str, run_uri: str) -> str:
    """`uri` inside the run as a path under it (the title names the run); others as they are."""
    prefix = run_uri.rstrip("/") + "/"
    return uri[len(prefix) :] if uri.startswith(prefix) else uri


def _last_report(stages: list[StageSummary]) -> EvalReport | None:
    """The run's last evaluation report (a DAG's final evaluate node), if it has one."""
    for s in reversed(stages):
        if s.output_uri.endswith("/report.json"):
            return EvalReport.model_validate(storage.read_json(s.output_uri))
    return None


def evaluation_lines(report: EvalReport, run_uri: str) -> list[str]:
    """One table of the report's models: format rate and accuracy [95% CI], and accuracy's
    change against the model before it with its exact McNemar p (paired on prompts)."""
    prompts = sorted({s.num_prompts for s in report.scores})
    counts = "/".join(str(n) for n in prompts)
    header = f"  {'evaluated (' + counts + ' prompts)':<28} {'format rate':<20} {'accuracy':<20} "
    lines = [header + "accuracy vs the row above", "  " + "-" * (WIDTH - 4)]
    for s in report.scores:
        name = s.name if len(s.name) <= 28 else s.name[:25] + "..."
        row = f"  {name:<28} {_rate(s, 'format_rate'):<20} {_rate(s, 'accuracy'):<20} {_change(s)}"
        lines.append(row.rstrip())
    lines += _reward_lines(report)
    report_md = relative(report.uri.rsplit("/", 1)[0] + "/report.md", run_uri)
    lines.append(f"  95% intervals (Wilson); every table, per domain too: {report_md}")
    return lines


def _reward_lines(report: EvalReport) -> list[str]:
    """One line per reward the evaluation also scored (a user's `eval.rewards`): its mean for
    each model, wrapped to the block's width."""
    names = sorted({k for s in report.scores for k in s.metrics if k.startswith(REWARD_PREFIX)})
    lines = []
    for key in names:
        means = ", ".join(
            f"{s.name} {s.metrics[key]:.3f}" for s in report.scores if key in s.metrics
        )
        text = f"{key.removeprefix(REWARD_PREFIX)} (mean): {means}"
        lines += textwrap.wrap(text, WIDTH - 2, initial_indent="  ", subsequent_indent="    ")
    return lines


def _rate(s: ModelScores, metric: str) -> str:
    low, high = s.metrics.get(f"{metric}_ci_low"), s.metrics.get(f"{metric}_ci_high")
    value = getattr(s, metric)
    return f"{value:.3f}" if low is None or high is None else f"{value:.3f} [{low:.2f}, {high:.2f}]"


def _change(s: ModelScores) -> str:
    difference = s.metrics.get(f"{VS_PREVIOUS}/difference")
    p_value = s.metrics.get(f"{VS_PREVIOUS}/p_value")
    if difference is None or p_value is None:
        return ""
    return f"{difference:+.3f} (McNemar p {p_value:.2g})"


def next_lines(summary: RunSummary, environ: dict[str, str]) -> list[str]:
    """The commands a person runs next: continue (an incomplete run), or export the last
    checkpoint; audit against the root just printed; watch it in the Prefect UI."""
    lines = ["Next:"]
    if summary.no_progress:
        lines.append(
            "  This session took no step and committed no stage: the same budget would stop at"
            "\n  the same point. Give it a longer --session-budget (exit 6)."
        )
    elif not summary.complete:
        lines.append("  Run the same command again to continue from here.")
    checkpoint = last_checkpoint(summary.stages)
    if summary.complete and checkpoint is not None:
        lines.append(f"  far export {checkpoint} ./{summary.run}-export")
    if summary.ledger_root:
        lines.append(f"  far audit {summary.run_uri} --expect-root {summary.ledger_root}")
    lines.append(f"  {_ui_line(environ)}")
    return lines


def last_checkpoint(stages: list[StageSummary]) -> str | None:
    """The output of the run's last training stage (a checkpoint directory), if any."""
    for s in reversed(stages):
        if "/checkpoints" in s.output_uri:
            return s.output_uri
    return None


def _ui_line(environ: dict[str, str]) -> str:
    """The UI's address on a kept server; how to keep one when the run used far's temporary
    server (which serves no UI: it sets PREFECT_UI_URL empty, and is gone when far exits)."""
    api, ui = environ.get("PREFECT_API_URL", ""), environ.get("PREFECT_UI_URL")
    if api and ui != "":
        return f"the Prefect UI: {ui or api.rstrip('/').removesuffix('/api')} (its flow runs)"
    return "the Prefect UI: `prefect server start`, then PREFECT_API_URL (docs/prefect-ui.md)"
