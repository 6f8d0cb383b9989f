"""`far status RUN`: each stage's state and progress, read from storage as data."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from flows.commands.options import (
    EXIT_INVALID,
    RUN_URI_HELP,
    add_json_option,
    add_plugin_check_option,
    add_root_options,
    expected_root,
    print_json,
)
from pipeline import lineage, manifest, plugin_check
from schemas import cli_output
from stages.core import storage


def add_command(commands: Any) -> None:
    """Register `far status`."""
    status = commands.add_parser(
        "status",
        help="show each stage's state and progress",
        description="Each stage of RUN: complete, partial (a training stage's latest checkpoint\n"
        "step of max_steps, an evaluation's batches of completions kept; sessions so far),\n"
        "not started, or superseded by an allowed change. A record the ledger does not\n"
        "vouch for (with --expect-root: one after the root) is unverified, never the\n"
        "current stage.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    status.add_argument("run_uri", help=RUN_URI_HELP)
    add_root_options(status)
    add_plugin_check_option(status)
    add_json_option(status, cli_output.StatusOutput)


def cmd_status(args: argparse.Namespace) -> int:
    run_uri = storage.normalize(args.run_uri)
    expect_root = expected_root(args)
    try:
        run_manifest = manifest.read_manifest(run_uri)
        doubts = lineage.record_doubts(run_uri, args.audit_key, expect_root, args.accept_later)
        found = plugin_check.report(run_uri, args.plugin, doubts)
        states = manifest.run_status(run_uri, doubts)
    except FileNotFoundError as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    last = run_manifest.invocations[-1] if run_manifest.invocations else None
    if args.json:
        print_json(
            cli_output.StatusOutput(
                run=run_manifest.run,
                run_uri=run_uri,
                sessions=len(run_manifest.invocations),
                last_outcome=last.outcome if last else None,
                stages=[_stage_status(s) for s in states],
                coverage=lineage.coverage(args.audit_key, expect_root),
                plugins_checked=found.checked,
                plugins_unchecked=found.unchecked,
            )
        )
        return 0
    print(
        f"FAR run '{run_manifest.run}' at {run_uri} ({len(run_manifest.invocations)} session(s); "
        f"last: {last.outcome or 'running or crashed' if last else 'none'})"
    )
    _print_table(states)
    for line in found.checked + found.unchecked:
        print(line)
    print(lineage.coverage(args.audit_key, expect_root))
    return 0


def _print_table(states: list[manifest.StageState]) -> None:
    """One line a stage directory, each column as wide as its widest cell, and under an
    unverified one the reason it is not the current stage."""
    rows = [
        (
            s.stage,
            s.state,
            _progress(s),
            f"{s.sessions} session(s)" if s.sessions else "",
            s.output_uri or s.directory or "",
        )
        for s in states
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    for state, row in zip(states, rows, strict=True):
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if state.doubt:
            print(f"  {'':<{widths[0]}}  not used as the current stage: {state.doubt}")


def _progress(state: manifest.StageState) -> str:
    """A training stage's step of max_steps; a partial evaluation's batches kept so far."""
    if state.max_steps is not None:
        return f"step {state.step if state.step is not None else 0}/{state.max_steps}"
    if state.batches:
        return f"{state.batches} batch{'es' if state.batches > 1 else ''} kept"
    return ""


def _stage_status(state: manifest.StageState) -> cli_output.StageStatus:
    fields = dataclasses.asdict(state)
    return cli_output.StageStatus(**{**fields, "doubt": state.doubt or None})
