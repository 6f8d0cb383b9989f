"""The `far` command line: run a FAR recipe through the Prefect flow.

Settings are read here, once, and passed down; nothing is configured at import time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import httpx

from pipeline import lineage, manifest
from pipeline.plan import RunPlan, plan_recipe, plan_run
from pipeline.recipes import RecipeError, parse_recipe
from schemas.record import RunSummary
from stages.core import storage
from stages.core.drift import DriftError
from stages.modeling import tunix_version

EXIT_INVALID = 2
EXIT_INCOMPLETE = 3
log = logging.getLogger("far")

DESCRIPTION = """\
FAR (Format-Align-Reinforce) post-trains a small Gemma model to reason:
data-prep -> SFT-format -> GRPO-reinforce -> evaluation, as one Prefect flow.

Every stage writes its output under {storage_root}/{name}/{stage}-{hash}/ and a record
(stage.json) last. Running the same recipe again skips every completed stage, so a run
that stopped (session over, machine preempted, a failure) continues where it left off.
"""

RUN_EPILOG = """\
examples:
  far run recipes/smoke.yaml                      tiny random model, about a minute on CPU
  far run recipes/smoke.yaml --root gs://bucket/far --session-budget 9h

Without PREFECT_API_URL, Prefect starts a temporary local server for the run (ephemeral
mode); point PREFECT_API_URL at `prefect server start` to watch runs in the UI.
Continuing a run with a changed recipe or stage code is refused with the differences
(exit 2); start a new run with --name, or accept named changes with --allow-change, e.g.
  far run recipes/smoke.yaml --allow-change sft.max_steps   (continues SFT from its checkpoint)
Exit codes: 0 complete, 2 invalid recipe or input, 3 stopped at the session deadline.
"""
EXIT_PROBLEMS = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="far", description=DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run (or continue) a FAR recipe end to end",
        description=(
            "Validate RECIPE in full, then run its four stages as a Prefect flow.\n"
            "Stages already complete on storage (a stage.json record) are skipped, so running\n"
            "the same command again continues a run that stopped."
        ),
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    run.add_argument("recipe", help="recipe YAML: a path, file://, gs:// or memory:// URI")
    run.add_argument("--root", help="override the recipe's storage_root (path or URI)")
    run.add_argument("--name", help="override the recipe's run name")
    run.add_argument(
        "--session-budget", help="stop cleanly after this long, e.g. 9h, 90m (overrides recipe)"
    )
    _add_session_options(run)
    _add_run_commands(commands)
    export = commands.add_parser(
        "export",
        help="write a checkpoint as a Hugging Face model directory",
        description=(
            "Merge a LoRA checkpoint into its base weights (or convert a full-weight one) and\n"
            "write a Hugging Face directory (model.safetensors, config.json, tokenizer) that\n"
            "transformers' AutoModelForCausalLM loads. CHECKPOINT_URI is an sft or grpo\n"
            "output URI as `far run` prints it."
        ),
        formatter_class=argparse.RawTextHelpFormatter,
    )
    export.add_argument("checkpoint_uri", help="checkpoint URI (path, file://, gs://)")
    export.add_argument("out_dir", help="output directory (path or gs:// URI)")
    export.add_argument(
        "--cache-dir",
        default=os.environ.get("FAR_CACHE_DIR"),
        help="converted model weights cache (default ~/.cache/far)",
    )
    _add_common_options(export)
    return parser


def _add_session_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-change",
        action="append",
        default=[],
        metavar="PATH",
        help="accept a change from the run's recipe or code, by dotted path (sft.max_steps)\n"
        "or prefix (sft); repeat for several",
    )
    parser.add_argument(
        "--cache-dir",
        default=os.environ.get("FAR_CACHE_DIR"),
        help="where converted model weights are cached (default: $FAR_CACHE_DIR or ~/.cache/far)",
    )
    _add_common_options(parser)


def _add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="show library logs too")
    parser.add_argument(
        "--allow-untested-tunix",
        action="store_true",
        help="run with a google-tunix version FAR's workarounds were not tested with\n"
        "(logged as a warning; default: refuse with both versions named)",
    )


def _add_run_commands(commands: Any) -> None:
    """status, resume, lineage and audit: they take a run URI ({storage_root}/{name})."""
    status = commands.add_parser(
        "status",
        help="show each stage's state and progress",
        description="Each stage of RUN: complete, partial (latest checkpoint step of max_steps,\n"
        "sessions so far), not started, or superseded by an allowed change.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    status.add_argument("run_uri", help="the run: {storage_root}/{name}, e.g. runs/smoke")
    resume = commands.add_parser(
        "resume",
        help="continue RUN with the recipe it was started with",
        description="Same as re-running `far run` with the recipe stored in RUN/run.json.",
    )
    resume.add_argument("run_uri", help="the run: {storage_root}/{name}, e.g. runs/smoke")
    resume.add_argument("--session-budget", help="stop cleanly after this long, e.g. 9h")
    _add_session_options(resume)
    lineage = commands.add_parser(
        "lineage",
        help="print the ancestry of an artifact back to its data sources",
        description="Which data, config, code, hardware and sessions produced URI (a stage\n"
        "output or stage directory), and the same for each of its inputs.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    lineage.add_argument("uri", help="an output URI as `far run` printed it, or a stage directory")
    lineage.add_argument(
        "--openlineage", metavar="FILE", help="also write the run's OpenLineage events (JSON lines)"
    )
    audit = commands.add_parser(
        "audit",
        help="re-check every recorded file and fingerprint of RUN",
        description="Re-hash every file each stage record lists and check each input against\n"
        "its upstream record. Exit 1 and list what is missing or altered.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    audit.add_argument("run_uri", help="the run: {storage_root}/{name}, e.g. runs/smoke")


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    quiet = logging.INFO if verbose else logging.WARNING
    for noisy in ("absl", "jax", "orbax", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(quiet)
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "stages,pipeline")


def print_summary(summary: RunSummary) -> None:
    state = "complete" if summary.complete else f"INCOMPLETE ({summary.stopped_reason})"
    print(f"\nFAR run '{summary.run}' at {summary.run_uri}: {state}")
    for s in summary.stages:
        took = "skipped (already complete)" if s.skipped else f"ran in {s.seconds:.1f} s"
        print(f"  {s.stage:<10} {took:<27} {s.output_uri}")
    for s in summary.stages:
        if s.stage == "evaluate":  # the report's table sits beside report.json
            print("\n" + storage.read_text(s.output_uri.rsplit("/", 1)[0] + "/report.md"))
    ran = sum(s.seconds for s in summary.stages)
    overhead = summary.seconds - ran
    share = f" ({100 * overhead / summary.seconds:.1f}%)" if summary.seconds else ""
    print(
        f"  flow {summary.seconds:.1f} s = stages {ran:.1f} s "
        f"+ orchestration {overhead:.1f} s{share}"
    )
    if not summary.complete:
        print("Run the same command again to continue from here.")


def cmd_run(args: argparse.Namespace) -> int:
    try:
        plan = plan_run(args.recipe, args.root, args.name, args.session_budget)
    except RecipeError as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    return run_and_report(plan, args.recipe, args)


def run_and_report(plan: RunPlan, recipe_source: str, args: argparse.Namespace) -> int:
    """Run the flow for a planned run; print the summary; the exit code."""
    try:
        from flows.far_flow import format_align_reinforce  # deferred: imports JAX and Prefect
    except tunix_version.UntestedTunixError as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    try:
        summary = format_align_reinforce(
            plan.recipe,
            plan.root,
            plan.deadline,
            args.cache_dir,
            allow_changes=args.allow_change,
            recipe_source=recipe_source,
        )
    except DriftError as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    except httpx.TransportError as e:  # the Prefect API went away; the stages did not
        return report_without_prefect(storage.join(plan.root, plan.recipe.name), e)
    print_summary(summary)
    return 0 if summary.complete else EXIT_INCOMPLETE


def report_without_prefect(run_uri: str, error: Exception) -> int:
    """The run's outcome read from storage, when Prefect could not report the flow's end."""
    print(
        f"far: the Prefect API became unreachable ({error!r}); the stages kept running and "
        f"their records are on storage:",
        file=sys.stderr,
    )
    states = manifest.run_status(run_uri)
    current = {s.stage: s.state for s in states if s.state != "superseded"}
    for stage, state in current.items():
        print(f"  {stage:<10} {state}")
    complete = all(state == "complete" for state in current.values())
    if not complete:
        print("Run the same command again to continue from here.")
    return 0 if complete else EXIT_INCOMPLETE


def cmd_resume(args: argparse.Namespace) -> int:
    run_uri = storage.normalize(args.run_uri)
    try:
        run_manifest = manifest.read_manifest(run_uri)
        overrides = {
            "storage_root": run_uri.rsplit("/", 1)[0],
            "name": run_manifest.run,
            "session_budget": args.session_budget,
        }
        recipe = parse_recipe(run_manifest.recipe, f"{run_uri}/run.json", overrides)
    except (FileNotFoundError, RecipeError) as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    return run_and_report(plan_recipe(recipe), run_manifest.recipe_source, args)


def cmd_status(args: argparse.Namespace) -> int:
    run_uri = storage.normalize(args.run_uri)
    try:
        run_manifest = manifest.read_manifest(run_uri)
        states = manifest.run_status(run_uri)
    except FileNotFoundError as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    last = run_manifest.invocations[-1] if run_manifest.invocations else None
    print(
        f"FAR run '{run_manifest.run}' at {run_uri} ({len(run_manifest.invocations)} session(s); "
        f"last: {last.outcome or 'running or crashed' if last else 'none'})"
    )
    for s in states:
        progress = ""
        if s.max_steps is not None:
            progress = f"step {s.step if s.step is not None else 0}/{s.max_steps}"
        sessions = f"{s.sessions} session(s)" if s.sessions else ""
        where = s.output_uri or s.directory or ""
        print(f"  {s.stage:<10} {s.state:<12} {progress:<14} {sessions:<13} {where}")
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    try:
        node = lineage.ancestry(args.uri)
        run_uri = node.record.directory.rsplit("/", 1)[0]
        run_manifest = manifest.read_manifest(run_uri)
    except FileNotFoundError as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    print(lineage.render(node, run_manifest))
    if args.openlineage:
        events = lineage.openlineage_events(run_uri)
        lines = "".join(json.dumps(e, sort_keys=True) + "\n" for e in events)
        storage.write_text(args.openlineage, lines)
        print(f"wrote {len(events)} OpenLineage events to {args.openlineage}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    run_uri = storage.normalize(args.run_uri)
    try:
        problems = lineage.audit(run_uri)
    except FileNotFoundError as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    records = lineage.run_records(run_uri)
    files = sum(len(r.files) for _, r in records)
    for problem in problems:
        print(problem)
    verdict = f"{len(problems)} problem(s)" if problems else "everything matches"
    print(f"audit of {run_uri}: {len(records)} records, {files} files: {verdict}")
    return EXIT_PROBLEMS if problems else 0


def cmd_export(args: argparse.Namespace) -> int:
    from stages.core.runner import RunContext
    from stages.export import export_checkpoint  # deferred: imports JAX and Tunix

    cache_dir = RunContext(root="", run="", cache_dir=args.cache_dir).model_cache
    try:
        out = export_checkpoint(args.checkpoint_uri, args.out_dir, cache_dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    print(f"exported {args.checkpoint_uri} -> {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(getattr(args, "verbose", False))
    if getattr(args, "allow_untested_tunix", False):
        log.warning("--allow-untested-tunix: an untested google-tunix version will be accepted")
        os.environ[tunix_version.ALLOW_UNTESTED_ENV] = "1"  # read when tunix_compat is imported
    handlers = {
        "run": cmd_run,
        "export": cmd_export,
        "resume": cmd_resume,
        "status": cmd_status,
        "lineage": cmd_lineage,
        "audit": cmd_audit,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
