"""`far runs ROOT`: every run under a storage root, how its last session ended, its ledger root.

One module per command: the parser's part (`add_command`) and the handler (`cmd_runs`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pipeline.runs import list_runs
from schemas import cli_output
from stages.core import storage

EXIT_INVALID = 2


def add_command(commands: Any) -> None:
    """Register `far runs` on the CLI's subcommands."""
    runs = commands.add_parser(
        "runs",
        help="list the runs under a storage root",
        description="Every run under ROOT (each directory with a run.json): how its last\n"
        "session ended (complete, stopped, failed, running, crashed), its sessions, when the\n"
        "last one started, and its ledger root. Read from storage alone: no Prefect server,\n"
        "and nothing a run names is imported; `far audit RUN --expect-root ROOT` verifies.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    runs.add_argument("root", help="the storage root: a path, file://, gs:// or memory:// URI")
    runs.add_argument(
        "--json",
        action="store_true",
        help=f"print one JSON object instead (RunsOutput, schema_version "
        f"{cli_output.SCHEMA_VERSION};\nits fields: docs/reference/json.md)",
    )


def cmd_runs(args: argparse.Namespace) -> int:
    """Print the runs under args.root (a table, or --json); exit 2 when there is no root."""
    root = storage.normalize(args.root)
    try:
        runs = list_runs(root)
    except FileNotFoundError as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        print(cli_output.RunsOutput(root=root, runs=runs).model_dump_json(indent=2))
        return 0
    if not runs:
        print(f"no FAR runs under {root} (a run is a directory with a run.json)")
        return 0
    print(f"{'run':<24} {'state':<10} {'sessions':>8}  {'last session':<20} ledger root")
    for run in runs:
        when = (run.last_session_at or "-")[:19].replace("T", " ")
        root_text = run.ledger_root or "-"
        print(f"{run.run:<24} {run.state:<10} {run.sessions:>8}  {when:<20} {root_text}")
        if run.state in ("failed", "unreadable"):
            print(f"{'':<24} {run.detail[:150]}")
    return 0
