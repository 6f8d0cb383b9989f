"""`far audit RUN`: re-check every recorded file, seal and ledger entry of a run."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flows.commands.options import (
    EXIT_INVALID,
    EXIT_PROBLEMS,
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
    """Register `far audit`."""
    audit = commands.add_parser(
        "audit",
        help="re-check every recorded file and fingerprint of RUN",
        description="Re-hash every file each stage record lists, check each input against\n"
        "its upstream record and every record and run.json against the run's ledger.\n"
        "Exit 1 and list what is missing or altered. With FAR_AUDIT_KEY set, every ledger\n"
        "entry must carry its signature. Without --expect-root or a key, a writer who can\n"
        "rewrite all of storage (and recompute seals and ledger) cannot be detected.\n"
        "With --expect-root, the root must be the ledger's last entry: each entry after it\n"
        "is a problem (--accept-later accepts later sessions' entries and lists them).",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    audit.add_argument("run_uri", help=RUN_URI_HELP)
    add_root_options(audit)
    add_plugin_check_option(audit)
    add_json_option(audit, cli_output.AuditOutput)


def cmd_audit(args: argparse.Namespace) -> int:
    run_uri = storage.normalize(args.run_uri)
    expect_root = expected_root(args)
    try:
        if not storage.exists(manifest.manifest_uri(run_uri)):
            manifest.read_manifest(run_uri)  # MissingInput: no run there
        doubts = lineage.record_doubts(run_uri, args.audit_key, expect_root, args.accept_later)
        found = plugin_check.report(run_uri, args.plugin, doubts)  # exit 2 before any check
        problems = lineage.audit(run_uri, args.audit_key, expect_root, args.accept_later)
    except FileNotFoundError as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    records = lineage.run_records(run_uri, problems=[])
    files = sum(len(r.files) for _, r in records)
    if args.json:
        print_json(
            cli_output.AuditOutput(
                run_uri=run_uri,
                records=len(records),
                files=files,
                ok=not problems,
                problems=problems,
                accepted_later=lineage.later_entries(run_uri, expect_root)
                if args.accept_later
                else [],
                coverage=lineage.coverage(args.audit_key, expect_root),
                plugins_checked=found.checked,
                plugins_unchecked=found.unchecked,
            )
        )
        return EXIT_PROBLEMS if problems else 0
    for problem in problems:
        print(problem)
    if args.accept_later:
        for line in lineage.later_entries(run_uri, expect_root):
            print(line)
    for line in found.checked + found.unchecked:
        print(line)
    verdict = _audit_verdict(problems, found.unchecked)
    print(f"audit of {run_uri}: {len(records)} records, {files} files: {verdict}")
    print(lineage.coverage(args.audit_key, expect_root))
    return EXIT_PROBLEMS if problems else 0


def _audit_verdict(problems: list[str], unchecked: list[str]) -> str:
    """Exit 0 says every stored byte matched; the verdict also says when plugin code the run
    used was not checked (its digest in the records was, as data)."""
    if problems:
        return f"{len(problems)} problem(s)"
    if unchecked:
        return "every record, file and ledger entry matches; plugin code not checked (above)"
    return "everything matches"
