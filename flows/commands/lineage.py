"""`far lineage URI`: the ancestry of an artifact back to its data sources (and OpenLineage)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flows.commands.options import (
    EXIT_INVALID,
    add_json_option,
    add_plugin_check_option,
    print_json,
)
from pipeline import lineage, manifest, plugin_check
from schemas import cli_output
from stages.core import storage
from stages.core.records import record_run


def add_command(commands: Any) -> None:
    """Register `far lineage`."""
    lineage = commands.add_parser(
        "lineage",
        help="print the ancestry of an artifact back to its data sources",
        description="Which data, config, code, hardware and sessions produced URI (a stage\n"
        "output or stage directory), and the same for each of its inputs.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    lineage.add_argument("uri", help="an output URI as `far run` printed it, or a stage directory")
    add_plugin_check_option(lineage)
    lineage.add_argument(
        "--openlineage", metavar="FILE", help="also write the run's OpenLineage events (JSON lines)"
    )
    add_json_option(lineage, cli_output.LineageOutput)


def cmd_lineage(args: argparse.Namespace) -> int:
    if args.openlineage:
        storage.check_regular_target(args.openlineage, "--openlineage")
    try:
        node = lineage.ancestry(args.uri)
        run_uri = record_run(node.record_uri)
        run_manifest = manifest.read_manifest(run_uri)
        found = plugin_check.report(run_uri, args.plugin, lineage.record_doubts(run_uri))
    except FileNotFoundError as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    if not args.json:
        print(lineage.render(node, run_manifest))
        for line in found.checked + found.unchecked:
            print(line)
    if args.openlineage:
        events = lineage.openlineage_events(run_uri)
        lines = "".join(json.dumps(e, sort_keys=True) + "\n" for e in events)
        storage.write_text(args.openlineage, lines)
        if not args.json:
            print(f"wrote {len(events)} OpenLineage events to {args.openlineage}")
    if args.json:
        print_json(
            cli_output.LineageOutput(
                uri=args.uri,
                run_uri=run_uri,
                artifact=lineage.as_entry(node, run_manifest),
                openlineage_file=args.openlineage,
            )
        )
    return 0
