"""The `far` command line: run a FAR recipe through the Prefect flow.

Settings are read here, once, and passed down; nothing is configured at import time.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from flows.runs import plan_run
from schemas.record import RunSummary
from stages import storage
from stages.recipes import RecipeError

EXIT_INVALID = 2
EXIT_INCOMPLETE = 3

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
Exit codes: 0 complete, 2 invalid recipe or input, 3 stopped at the session deadline.
"""


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
    run.add_argument(
        "--cache-dir",
        default=os.environ.get("FAR_CACHE_DIR"),
        help="where converted model weights are cached (default: $FAR_CACHE_DIR or ~/.cache/far)",
    )
    run.add_argument("-v", "--verbose", action="store_true", help="show library logs too")
    export = commands.add_parser(
        "export", help="write a checkpoint as a Hugging Face model directory",
        description=(
            "Merge a LoRA checkpoint into its base weights (or convert a full-weight one) and\n"
            "write a Hugging Face directory (model.safetensors, config.json, tokenizer) that\n"
            "transformers' AutoModelForCausalLM loads. CHECKPOINT_URI is an sft or grpo\n"
            "output URI as `far run` prints it."
        ),
        formatter_class=argparse.RawTextHelpFormatter,
    )  # fmt: skip
    export.add_argument("checkpoint_uri", help="checkpoint URI (path, file://, gs://)")
    export.add_argument("out_dir", help="output directory (path or gs:// URI)")
    export.add_argument("--cache-dir", default=os.environ.get("FAR_CACHE_DIR"),
                        help="converted model weights cache (default ~/.cache/far)")  # fmt: skip
    export.add_argument("-v", "--verbose", action="store_true", help="show library logs too")
    return parser


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    quiet = logging.INFO if verbose else logging.WARNING
    for noisy in ("absl", "jax", "orbax", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(quiet)
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "stages")


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
    from flows.far_flow import format_align_reinforce  # deferred: imports JAX and Prefect

    summary = format_align_reinforce(plan.recipe, plan.root, plan.deadline, args.cache_dir)
    print_summary(summary)
    return 0 if summary.complete else EXIT_INCOMPLETE


def cmd_export(args: argparse.Namespace) -> int:
    from stages.export import export_checkpoint  # deferred: imports JAX and Tunix
    from stages.runner import RunContext

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
    configure_logging(args.verbose)
    handlers = {"run": cmd_run, "export": cmd_export}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
