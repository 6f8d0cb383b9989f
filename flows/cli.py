"""The `far` command line: run a FAR recipe through the Prefect flow.

Settings are read here, once, and passed down; nothing is configured at import time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import BaseModel, SecretStr

from flows import cmd_runs, console_summary, prefect_server
from pipeline import lineage, manifest, plugin_check, plugins
from pipeline.dag import build_dag
from pipeline.lease import LeaseHeld
from pipeline.plan import (
    NodePlan,
    RunPlan,
    SettledNode,
    check_changed_code,
    plan_recipe,
    plan_run,
    preview,
    render_preview,
    settled,
    settled_summary,
    with_models,
)
from pipeline.recipes import (
    BUNDLED,
    RecipeError,
    bundled_recipes,
    copy_bundled,
    parse_recipe,
    resolve_recipe_uri,
)
from pipeline.validate import check_session_budget, ignored_eval_models, validate_run
from schemas import cli_output
from schemas.record import RunSummary
from stages import registry
from stages.core import drift, ledger, storage
from stages.core.errors import InputError, is_input_error
from stages.core.runner import RunContext, find_checkpoint_record, record_run
from stages.core.sessions import LeaseLost, SaveFailed
from stages.modeling import tunix_version
from stages.rewards import IsolationUnavailable

EXIT_PROBLEMS = 1  # `far audit` found problems; also a defect or outage (with its traceback)
EXIT_INVALID = 2
EXIT_INCOMPLETE = 3
EXIT_LEASE_HELD = 4  # another session holds the run's lease (one writer per run)
EXIT_LEASE_LOST = 5  # this session lost the run's lease to another one and stopped at once
EXIT_NO_PROGRESS = 6  # stopped at the deadline before any stage committed or took a step
EXIT_ABORTED = 130  # a second Ctrl-C (or one outside a run's stages): no save
FULL_DISK_TEXTS = ("No space left on device", "Disk quota exceeded")
AUDIT_KEY_ENV = "FAR_AUDIT_KEY"  # signs (far run) and verifies (far audit) the run's ledger
log = logging.getLogger("far")

EXIT_CODES = """\
Exit codes: 0 done (for `far validate`: the recipe is valid and the session would start);
1 `far audit` found problems, or a defect or outage (printed with its traceback);
2 invalid recipe or input, one line naming the field or file (-v adds the traceback);
3 stopped at the session deadline, by SIGTERM or by a first Ctrl-C, after saving (run the
same command again to continue);
4 another session holds the run's lease (it names the holder; see --lease-wait);
5 this session lost the run's lease to another session and stopped at once (it wrote nothing
after losing it);
6 stopped at the session deadline without progress: no stage committed and no training step
was taken, so the same budget would stop at the same point (give it a longer --session-budget);
130 a second Ctrl-C (aborted without saving).
"""

# the kinds beyond the default pipeline's (whose kinds read a recipe section when configless)
OTHER_KINDS = ", ".join(k for k, s in registry.REGISTRY.items() if s.section is None)
DESCRIPTION = f"""\
FAR (Format-Align-Reinforce) post-trains an open model to reason. A recipe names a DAG of
stages (by default data-prep -> SFT-format -> GRPO-reinforce -> evaluation; also
{OTHER_KINDS}) run as one Prefect flow. Start with `far run smoke`."""

EPILOG = f"""\
Every stage writes its output under {{storage_root}}/{{name}}/{{node}}-{{hash}}/ and a record
(stage.json) last. Running the same recipe again skips every completed stage, so a run
that stopped (session over, machine preempted, a failure) continues where it left off.
`far COMMAND --help` explains each command.

{EXIT_CODES}"""

RUN_EPILOG = f"""\
examples:
  far run recipes/smoke.yaml                      tiny random model, about a minute on CPU
  far run recipes/smoke.yaml sft.max_steps=20 --name smoke-short
  far run recipes/smoke.yaml --root gs://bucket/far --session-budget 9h

Without a Prefect API (PREFECT_API_URL or a profile's), far starts a temporary local server
for the run, in its own session (a Ctrl-C reaches far only) and stopped when far exits or
dies; point PREFECT_API_URL at `prefect server start` to watch runs in the UI.
Ctrl-C during training saves and stops like SIGTERM (exit 3); a second Ctrl-C aborts (130).
Continuing a run with a changed recipe or stage code is refused with the differences
(exit 2); start a new run with --name, or accept named changes with --allow-change, e.g.
  far run recipes/smoke.yaml --allow-change sft.max_steps   (continues SFT from its checkpoint)
Before any stage runs, the recipe and every node of its DAG (rewards, verify lists,
preferences sources, data files, evaluation checkpoints), the mesh (against the devices
present), model and tokenizer, and storage root are checked: `far validate` runs the same
checks and prints the plan without running anything. An invalid input found at any point,
bad data included, ends the run with one line naming the field or file.
Every commit is chained into the run's ledger (RUN/ledger.jsonl); the run ends by printing
the ledger root: keep it, and `far audit RUN --expect-root ROOT` detects a rewrite of storage
and names every entry appended after that root.
With FAR_AUDIT_KEY set, every ledger entry is also signed (HMAC-SHA256).
{EXIT_CODES}"""
EXIT_PREFECT = 1
# Prefect's temporary server (a new SQLite database, migrations, then the API) starts in about
# 11 s on an idle 2-core machine and took longer than Prefect's 20 s default on a busy one.
EPHEMERAL_STARTUP_SECONDS = 300
EPHEMERAL_TIMEOUT_TEXT = prefect_server.TIMEOUT_TEXT
STARTUP_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"  # far's temporary server too
PREFECT_DEFAULTS = {
    STARTUP_ENV: str(EPHEMERAL_STARTUP_SECONDS),
    # The temporary server's telemetry heartbeat writes to its new SQLite database while the
    # flow does and fails with "database is locked" (an ERROR and two tracebacks).
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # The client's usage telemetry, and its first-run notice on every new PREFECT_HOME
    # (FAR runs offline; set DO_NOT_TRACK=0 to keep Prefect's default).
    "DO_NOT_TRACK": "1",
    # A library's own thread (Tunix's GRPO learner reads its data, and so reports progress,
    # ahead in one) has no flow run context: its log lines still reach the console, and
    # Prefect's UserWarning that they cannot reach the API is one no user can act on.
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="far",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"far {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run (or continue) a FAR recipe end to end",
        description=(
            "Validate RECIPE in full, then run its DAG of stages as a Prefect flow.\n"
            "Stages already complete on storage (a stage.json record) are skipped, so running\n"
            "the same command again continues a run that stopped."
        ),
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    _add_recipe_arguments(run)
    run.add_argument(
        "--session-budget", help="stop cleanly after this long, e.g. 9h, 90m (overrides recipe)"
    )
    _add_session_options(run)
    _add_validate_command(commands)
    _add_run_commands(commands)
    _add_recipes_command(commands)
    cmd_runs.add_command(commands)
    export = commands.add_parser(
        "export",
        help="write a checkpoint as a Hugging Face model directory",
        description=(
            "Merge a LoRA checkpoint into its base weights (or convert a full-weight one) and\n"
            "write a Hugging Face directory that transformers' AutoModelForCausalLM loads:\n"
            "model.safetensors, config.json, the tokenizer with FAR's chat template,\n"
            "generation_config.json (greedy, stops at <end_of_turn>) and a model card\n"
            "(README.md: recipe, data, stages, evaluations, ledger root). CHECKPOINT_URI is\n"
            "an sft or grpo output URI as `far run` prints it.\n"
            "First the checkpoint's files are checked against its record, and its record and\n"
            "the upstream ones the card lists against the ledger (and --expect-root): any\n"
            "difference is exit 1, nothing written. OUT_DIR is new, empty or a previous FAR\n"
            "export (far-export.json), which is replaced whole."
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
    export.add_argument(
        "--adapter",
        action="store_true",
        help="write a peft LoRA adapter (adapter_config.json, adapter_model.safetensors)\n"
        "instead of merged weights, with the base's own export in OUT_DIR/base unless the\n"
        "base is a hub repository",
    )
    export.add_argument(
        "--push-to",
        metavar="REPO",
        help="also push the export to this hub repository (NAMESPACE/NAME); the token\n"
        "comes from HF_TOKEN or `hf auth login`",
    )
    export.add_argument(
        "--hub-endpoint",
        metavar="URL",
        default=os.environ.get("HF_ENDPOINT"),
        help="the hub to push to (default HF_ENDPOINT, else huggingface.co)",
    )
    _add_root_options(export)
    _add_common_options(export)
    return parser


def _add_recipes_command(commands: Any) -> None:
    recipes = commands.add_parser(
        "recipes",
        help="list the bundled recipes, or copy one to edit",
        description="The recipes shipped in recipes/, each with its first comment line.\n"
        "`far recipes copy NAME DEST` copies one (DEST: a file, or a directory to hold\n"
        "NAME.yaml; an existing file is never overwritten), to edit and `far run`.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    actions = recipes.add_subparsers(dest="recipes_action", metavar="ACTION")
    copy = actions.add_parser("copy", help="copy bundled recipe NAME to DEST")
    copy.add_argument("name", help="a bundled recipe's name, e.g. smoke")
    copy.add_argument("dest", help="a file or an existing directory (path or URI)")


def cmd_recipes(args: argparse.Namespace) -> int:
    if args.recipes_action == "copy":
        written = copy_bundled(args.name, args.dest)
        print(f"copied {args.name} -> {written} (run it: far run {written})")
        return 0
    found = bundled_recipes()
    width = max(map(len, found), default=0)
    for name, summary in found.items():
        print(f"{name:<{width}}  {summary}")
    print(f"\n{len(found)} recipes in {BUNDLED}; copy one: far recipes copy NAME DEST")
    return 0


def package_version() -> str:
    """The installed far package's version (the source tree's when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("far")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _add_validate_command(commands: Any) -> None:
    validate = commands.add_parser(
        "validate",
        help="check a recipe in full and print the plan, without running anything",
        description=(
            "Every check `far run` makes before compute (the recipe, each node of its DAG,\n"
            "the mesh, model and tokenizer, data files, storage root), then the plan: each\n"
            "node in the order it runs, its stage hash where its directory exists, and\n"
            "whether a run would run it, continue it, skip it, or be refused by the drift\n"
            "guard. No model is built (only its tokenizer) and nothing is trained. It writes\n"
            "only a probe in the storage root, or the nearest parent of it that exists\n"
            "(deleted: a new root is not created) and, for a model not cached yet,\n"
            "its weights into the cache (downloaded or converted once, as `far run` would)."
        ),
        epilog="Exit codes: 0 valid and the session would start; 2 invalid, or refused by\n"
        "the drift guard (the changes and the --allow-change flags are named).",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    _add_recipe_arguments(validate)
    validate.add_argument(
        "--session-budget", help="as for `far run`: checked like the recipe's session_budget"
    )
    _add_session_options(validate)  # every `far run` option, so a run line checks as it is
    _add_json_option(validate, cli_output.ValidateOutput)


def _add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """The recipe, its KEY=VALUE overrides, --root and --name: what `far run` and
    `far validate` share."""
    parser.add_argument(
        "recipe",
        help="recipe YAML: a path, file://, gs:// or memory:// URI, or a bundled recipe's name\n"
        "(`far recipes` lists them), e.g. smoke",
    )
    _add_override_argument(parser)
    parser.add_argument("--root", help="override the recipe's storage_root (path or URI)")
    parser.add_argument("--name", help="override the recipe's run name")
    _add_plugin_option(parser)


def _add_plugin_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first: a module that registers stage kinds and/or rewards, so\n"
        "the recipe can name them (docs/adding-a-stage.md, docs/your-own-task.md);\n"
        "repeatable; a recipe's `plugins:` list does the same without the flag. A run\n"
        "records the modules it used (run.json), which resume imports",
    )


READS_A_RUN = ("status", "audit", "lineage")
"""Commands that read a run as data: they import no module, neither one the run names nor
one --plugin names (pipeline/plugin_check.py)."""


def _add_plugin_check_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="check your copy of a plugin the run used: MODULE's file (found on the Python\n"
        "path or in the current directory, not imported) must have the sha256 the run's\n"
        "records hold for it, else exit 2; repeatable. Nothing a run names is ever imported;\n"
        "each plugin it names that no --plugin checked is listed as not checked",
    )


def _add_override_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="change a recipe field by its dotted path before validation, e.g.\n"
        "sft.max_steps=20 grpo.rewards='{answer_match: 1.0}' (values are YAML); recorded\n"
        "in run.json as given; on an existing run the drift guard treats it as a recipe edit",
    )


def _wait_seconds(text: str) -> float:
    """A finite, non-negative number of seconds (nan, inf or a negative wait means nothing)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(
            f"got {text!r}; expected a finite number of seconds >= 0 (e.g. 600)"
        )
    return seconds


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
    parser.add_argument(
        "--lease-wait",
        type=_wait_seconds,
        default=0.0,
        metavar="SECONDS",
        help="if another session holds the run's lease, wait this long for it (default 0),\n"
        "then exit 4 naming the holder",
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="one of several hosts of a TPU slice running this same command: join them with\n"
        "jax.distributed (process 0 alone writes records, run.json and the lease)",
    )
    parser.add_argument(
        "--compile-cache",
        default=os.environ.get("FAR_COMPILE_CACHE"),
        metavar="DIR",
        help="JAX's persistent compilation cache, a path or gs:// URI, so a restarted session\n"
        "skips XLA compilation (default: $FAR_COMPILE_CACHE or the --cache-dir)",
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
        "sessions so far), not started, or superseded by an allowed change. A record the\n"
        "ledger does not vouch for (with --expect-root: one after the root) is unverified,\n"
        "never the current stage.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    status.add_argument("run_uri", help="the run: {storage_root}/{name}, e.g. runs/smoke")
    _add_root_options(status)
    _add_plugin_check_option(status)
    _add_json_option(status, cli_output.StatusOutput)
    resume = commands.add_parser(
        "resume",
        help="continue RUN with the recipe it was started with",
        description="Same as re-running `far run` with the recipe stored in RUN/run.json.",
    )
    resume.add_argument("run_uri", help="the run: {storage_root}/{name}, e.g. runs/smoke")
    resume.add_argument("--session-budget", help="stop cleanly after this long, e.g. 9h")
    _add_session_options(resume)
    _add_plugin_option(resume)
    lineage = commands.add_parser(
        "lineage",
        help="print the ancestry of an artifact back to its data sources",
        description="Which data, config, code, hardware and sessions produced URI (a stage\n"
        "output or stage directory), and the same for each of its inputs.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    lineage.add_argument("uri", help="an output URI as `far run` printed it, or a stage directory")
    _add_plugin_check_option(lineage)
    lineage.add_argument(
        "--openlineage", metavar="FILE", help="also write the run's OpenLineage events (JSON lines)"
    )
    _add_json_option(lineage, cli_output.LineageOutput)
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
    audit.add_argument("run_uri", help="the run: {storage_root}/{name}, e.g. runs/smoke")
    _add_root_options(audit)
    _add_plugin_check_option(audit)
    _add_json_option(audit, cli_output.AuditOutput)


def _add_json_option(parser: argparse.ArgumentParser, model: type[Any]) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print one JSON object instead ({model.__name__}, schema_version "
        f"{cli_output.SCHEMA_VERSION};\nits fields: docs/reference/json.md)",
    )


def print_json(output: BaseModel) -> None:
    print(output.model_dump_json(indent=2))


def _add_root_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--expect-root",
        metavar="DIGEST",
        help="the ledger root `far run` printed (or its Prefect artifact shows): the ledger\n"
        "must end at it, so a chain recomputed after a rewrite, and every entry appended\n"
        "after the root, is reported (status shows such records as unverified)",
    )
    parser.add_argument(
        "--accept-later",
        action="store_true",
        help="accept ledger entries after --expect-root (later sessions of this run),\n"
        "listing each of them",
    )


def configure_logging(verbose: bool) -> None:
    """INFO lines on the console: their message alone, or with time and logger under -v."""
    plain = "%(message)s"
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s" if verbose else plain
    )
    quiet = logging.INFO if verbose else logging.WARNING
    for noisy in ("absl", "jax", "orbax", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(quiet)
    absl = logging.getLogger("absl")
    if not verbose and not any(isinstance(f, DropHarmlessNotices) for f in absl.filters):
        absl.addFilter(DropHarmlessNotices())
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "stages,pipeline")


def configure_prefect(environ: dict[str, str]) -> None:
    """Prefect settings `far` needs, unless the user set them; before Prefect is imported."""
    for key, value in PREFECT_DEFAULTS.items():
        environ.setdefault(key, value)


class DropHarmlessNotices(logging.Filter):
    """Drops library warnings a user cannot act on (shown with -v): Tunix's memory report,
    on each GRPO start, warns "Skipping non-TPU device: cpu. You might be missing jax[tpu]
    dependency." on a CPU or GPU, where it only skips reporting TPU memory."""

    TEXTS = ("Skipping non-TPU device:",)

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in self.TEXTS)


class HideInputErrorTracebacks(logging.Filter):
    """Drops the console lines (Prefect's, and the tracebacks of Orbax's failed background
    saves) about a run that ended on an error `far` prints once as one line: an input error, a
    lease held or lost, a write storage refused; the Prefect API and UI still get them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            return not is_one_line_error(record.exc_info[1])
        message = record.getMessage()  # "Finished in state Failed('... InputError: ...')"
        return not ("Failed(" in message and any(name in message for name in ONE_LINE_ERRORS))


INPUT_ERROR_NAMES = (
    "InputError",
    "MissingInput",
    "UnreachableInput",
    "RecipeError",
    "DriftError",
    "TamperedStage",
)
# errors `far` reports as one line with their own exit code; a full disk's text included
ONE_LINE_ERRORS = (*INPUT_ERROR_NAMES, "LeaseHeld", "LeaseLost", "SaveFailed", *FULL_DISK_TEXTS)


def is_one_line_error(error: BaseException) -> bool:
    """An error `far` prints as one line (input, lease, a refused write): no traceback."""
    if is_input_error(error) or storage.write_failure(error) is not None:
        return True
    return isinstance(error, LeaseHeld | LeaseLost | SaveFailed)


def quiet_prefect_console() -> None:
    """Attach HideInputErrorTracebacks to the console handlers Prefect's records reach (the
    root logger's and Prefect's own, as configured once Prefect is imported); never to its API
    handler, so the UI keeps the whole failure."""
    for name in (None, "prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            hidden = any(isinstance(f, HideInputErrorTracebacks) for f in handler.filters)
            if isinstance(handler, logging.StreamHandler) and not hidden:
                handler.addFilter(HideInputErrorTracebacks())


def report_input_error(error: BaseException, verbose: bool) -> int:
    """One line on stderr naming what to fix (the traceback too with -v); exit status 2."""
    if verbose:
        traceback.print_exception(error)
    print(f"far: {_input_error_of(error)}", file=sys.stderr)
    return EXIT_INVALID


def _input_error_of(error: BaseException) -> BaseException:
    current: BaseException | None = error
    while current is not None:
        if isinstance(current, InputError | tunix_version.UntestedTunixError):
            return current
        current = current.__cause__ or current.__context__
    return error


def report_prefect_start_failure(error: RuntimeError) -> int:
    seconds = os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")
    print(
        f"far: Prefect's temporary local server did not start within {seconds} s ({error}). "
        f"Nothing ran. Allow it longer with PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, "
        f"or start `prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api.",
        file=sys.stderr,
    )
    return EXIT_PREFECT


def print_summary(summary: RunSummary, note: str = "") -> None:
    """The run's titled summary block (flows/console_summary.py), `note` under its stages."""
    print("\n".join(console_summary.summary_lines(summary, note=note)))


def cmd_run(args: argparse.Namespace) -> int:
    args.recipe = resolve_recipe_uri(args.recipe)  # a bundled recipe's name: `far run smoke`
    try:
        plan = plan_run(args.recipe, args.root, args.name, args.session_budget, args.overrides)
    except (RecipeError, IsolationUnavailable) as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    return run_and_report(plan, args.recipe, args)


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate like `far run`, print the plan; exit 0, or 2 when anything would be refused."""
    args.recipe = resolve_recipe_uri(args.recipe)
    try:
        plan = plan_run(args.recipe, args.root, args.name, args.session_budget, args.overrides)
    except IsolationUnavailable as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    cache_dir = RunContext(root="", run="", cache_dir=args.cache_dir).model_cache
    check_session_budget(plan.recipe)
    done = settled(plan.recipe, plan.root, args.allow_change, args.audit_key)
    validate_run(plan.recipe, plan.root, cache_dir, computes=done is None)
    if done is None:
        nodes, refused = preview(plan.recipe, plan.root, args.allow_change, args.cache_dir)
    else:  # decided from the records alone: no stage module (JAX) is imported
        nodes, refused = (
            [NodePlan(n.node, n.kind, "skip", n.stage_hash, "complete") for n in done],
            None,
        )
    nodes = with_models(plan.recipe, nodes)  # each evaluate node's models, in the plan
    run_uri = storage.join(plan.root, plan.recipe.name)
    if args.json:
        print_json(
            cli_output.ValidateOutput(
                recipe=args.recipe,
                run=plan.recipe.name,
                run_uri=run_uri,
                valid=refused is None,
                refused=refused,
                nodes=[cli_output.PlannedNode(**dataclasses.asdict(n)) for n in nodes],
                warnings=ignored_eval_models(plan.recipe),
            )
        )
        if refused is not None:
            print(f"far: {refused}", file=sys.stderr)
        return EXIT_INVALID if refused is not None else 0
    print(f"recipe {args.recipe}: valid; run '{plan.recipe.name}' at {run_uri}")
    print(f"  {'node':<14} {'kind':<12} {'stage hash':<13} {'action':<9} why")
    print(render_preview(nodes))
    if refused is not None:
        print(f"far: {refused}", file=sys.stderr)
        return EXIT_INVALID
    return 0


def run_and_report(plan: RunPlan, recipe_source: str, args: argparse.Namespace) -> int:
    """Validate the planned run, run the flow, print the summary; the exit code.

    Input errors (stages.core.errors.InputError, raised before or during the run) propagate
    to `main`, which prints them as one line with exit 2.
    """
    started = time.perf_counter()
    print(_opening_line(plan), flush=True)
    cache_dir = RunContext(root="", run="", cache_dir=args.cache_dir).model_cache
    check_session_budget(plan.recipe)
    if not args.distributed:  # every host of a slice joins jax.distributed, even for nothing
        changed: list[tuple[str, drift.Change]] = []
        done = settled(plan.recipe, plan.root, args.allow_change, args.audit_key, changed)
        if done is not None:
            validate_run(plan.recipe, plan.root, cache_dir, computes=False)
            return report_settled(plan, done, time.perf_counter() - started)
        for line in check_changed_code(changed, args.allow_change):
            print(f"far: {line}; the stages decide what runs again")
    validate_run(plan.recipe, plan.root, cache_dir)
    try:  # before the flow module: Prefect must see the server's URL when it starts
        startup = float(os.environ.get(STARTUP_ENV, EPHEMERAL_STARTUP_SECONDS))
        prefect_server.ensure_api(os.environ, startup)
    except RuntimeError as e:
        return report_prefect_start_failure(e)
    try:
        from flows.far_flow import format_align_reinforce  # deferred: imports JAX and Prefect
    except tunix_version.UntestedTunixError as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    if not args.verbose:
        quiet_prefect_console()  # after Prefect configured its logging on import
    if args.distributed:
        import jax

        jax.distributed.initialize()  # the slice's workers, found from the TPU environment
    try:
        summary = format_align_reinforce(
            plan.recipe,
            plan.root,
            plan.deadline,
            args.cache_dir,
            allow_changes=args.allow_change,
            recipe_source=recipe_source,
            lease_wait_seconds=args.lease_wait,
            overrides=list(getattr(args, "overrides", [])),
            compile_cache=args.compile_cache,
            audit_key=args.audit_key,
        )
    except LeaseHeld as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_LEASE_HELD
    except LeaseLost as e:
        print(f"far: {e}; this session stopped at once (exit {EXIT_LEASE_LOST})", file=sys.stderr)
        return EXIT_LEASE_LOST
    except SaveFailed as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INCOMPLETE
    except httpx.TransportError as e:  # the Prefect API went away; the stages did not
        return report_without_prefect(storage.join(plan.root, plan.recipe.name), e)
    except Exception as e:
        cause = storage.write_failure(e)  # a write outside a stage: run.json, the ledger
        if cause is not None:
            print(
                f"far: could not save ({cause}); everything committed before is kept: "
                f"make room, then run the same command again to continue",
                file=sys.stderr,
            )
            return EXIT_INCOMPLETE
        if not isinstance(e, RuntimeError) or EPHEMERAL_TIMEOUT_TEXT not in str(e):
            raise
        return report_prefect_start_failure(e)
    print_summary(summary)
    return exit_code(summary)


def _opening_line(plan: RunPlan) -> str:
    """What will run and where: the first line `far run` prints, before any slow step."""
    nodes = " -> ".join(build_dag(plan.recipe).ids)
    run_uri = storage.join(plan.root, plan.recipe.name)
    return f"far: run '{plan.recipe.name}' at {run_uri}: {nodes}"


def report_settled(plan: RunPlan, done: list[SettledNode], seconds: float) -> int:
    """The summary of a run that is already complete, from its records: no session is started
    (no Prefect, no JAX, nothing written), so run.json and the ledger root stay as they were."""
    print_summary(
        settled_summary(plan.recipe, plan.root, done, seconds),
        note="Nothing to run: every stage is complete and verified against its record and the "
        "ledger; no session was started, so run.json and the ledger root are unchanged.",
    )
    return 0


def exit_code(summary: RunSummary) -> int:
    """0 complete; 6 stopped without progress; 3 stopped, to be continued."""
    if summary.complete:
        return 0
    return EXIT_NO_PROGRESS if summary.no_progress else EXIT_INCOMPLETE


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
        plugins.import_plugins(run_manifest.plugins)  # the kinds and rewards its recipe names
        recipe = parse_recipe(run_manifest.recipe, f"{run_uri}/run.json", overrides)
        plan = plan_recipe(recipe)
    except (FileNotFoundError, RecipeError, IsolationUnavailable) as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    return run_and_report(plan, run_manifest.recipe_source, args)


def cmd_status(args: argparse.Namespace) -> int:
    run_uri = storage.normalize(args.run_uri)
    expect_root = _expected_root(args)
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
    for s in states:
        progress = ""
        if s.max_steps is not None:
            progress = f"step {s.step if s.step is not None else 0}/{s.max_steps}"
        sessions = f"{s.sessions} session(s)" if s.sessions else ""
        where = s.output_uri or s.directory or ""
        print(f"  {s.stage:<10} {s.state:<12} {progress:<14} {sessions:<13} {where}")
        if s.doubt:
            print(f"  {'':<10} not used as the current stage: {s.doubt}")
    for line in found.checked + found.unchecked:
        print(line)
    print(lineage.coverage(args.audit_key, expect_root))
    return 0


def _stage_status(state: manifest.StageState) -> cli_output.StageStatus:
    fields = dataclasses.asdict(state)
    return cli_output.StageStatus(**{**fields, "doubt": state.doubt or None})


def _expected_root(args: argparse.Namespace) -> str | None:
    """--expect-root, checked to be a root (a bad one is exit 2, one line, not tampering)."""
    if args.expect_root is None:
        if args.accept_later:
            raise ledger.BadRoot("--accept-later: accepts entries after --expect-root; give both")
        return None
    return ledger.check_root(args.expect_root)


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


def cmd_audit(args: argparse.Namespace) -> int:
    run_uri = storage.normalize(args.run_uri)
    expect_root = _expected_root(args)
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


def cmd_export(args: argparse.Namespace) -> int:
    from stages.modeling import export_card, export_target, hub_push  # no JAX

    export_target.check(args.out_dir)  # before the seconds importing JAX and Tunix
    expect_root = _expected_root(args)
    record_uri, record = find_checkpoint_record(args.checkpoint_uri)
    if args.adapter and getattr(record.output, "lora", None) is None:
        raise InputError(
            f"--adapter: checkpoint {args.checkpoint_uri} holds full weights, not LoRA "
            "adapters; export it without --adapter"
        )
    vouched = [uri for uri, _ in reversed(export_card.upstream(record_uri, record))]
    problems = lineage.export_problems(vouched, args.audit_key, expect_root, args.accept_later)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        print(
            f"far: export refused, nothing written: {problems[0]}{more}; "
            f"`far audit {record_run(record_uri)}` lists every problem",
            file=sys.stderr,
        )
        return EXIT_PROBLEMS
    facts = export_card.gather(args.checkpoint_uri)
    then = None
    if args.push_to:
        api = hub_push.hub_api(args.push_to, args.hub_endpoint)
        message = f"far export {facts.stage} step {facts.step}"
        then = lambda local: hub_push.push(api, args.push_to, local, message)  # noqa: E731
    from stages.modeling.hf_export import ExportOptions, export_checkpoint  # imports JAX, Tunix

    options = ExportOptions(
        adapter=args.adapter,
        card=export_card.model_card(facts, args.adapter),
        max_new_tokens=export_card.eval_max_new_tokens(facts),
        then=then,
    )
    cache_dir = RunContext(root="", run="", cache_dir=args.cache_dir).model_cache
    out = export_checkpoint(args.checkpoint_uri, args.out_dir, cache_dir, options)
    print(f"exported {args.checkpoint_uri} -> {out}")
    if args.push_to:
        print(f"pushed to {args.push_to} at {api.endpoint}")
    return 0


def parse_arguments(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """argparse, plus `far run` KEY=VALUE overrides placed anywhere (after options too)."""
    args, extra = parser.parse_known_args(argv)
    if hasattr(args, "overrides"):
        unknown = [e for e in extra if e.startswith("-") or "=" not in e]
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_arguments(parser, argv)
    verbose = getattr(args, "verbose", False)
    configure_logging(verbose)
    configure_prefect(os.environ)  # type: ignore[arg-type]
    key = os.environ.get(AUDIT_KEY_ENV)
    args.audit_key = SecretStr(key) if key else None  # read once here, passed down
    if getattr(args, "allow_untested_tunix", False):
        log.warning("--allow-untested-tunix: an untested google-tunix version will be accepted")
        os.environ[tunix_version.ALLOW_UNTESTED_ENV] = "1"  # read when tunix_compat is imported
    loads = [] if args.command in READS_A_RUN else getattr(args, "plugin", [])
    for module in loads:  # before any recipe loads
        try:
            log.info("--plugin %s: registered %s", module, plugins.load_plugin(module))
        except registry.PluginError as e:
            return report_input_error(e, verbose)
    handlers = {
        "run": cmd_run,
        "validate": cmd_validate,
        "export": cmd_export,
        "resume": cmd_resume,
        "status": cmd_status,
        "lineage": cmd_lineage,
        "audit": cmd_audit,
        "recipes": cmd_recipes,
        "runs": cmd_runs.cmd_runs,
    }
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        print(
            "far: aborted by Ctrl-C without saving the steps after the last checkpoint; "
            "run the same command again to continue from there",
            file=sys.stderr,
        )
        return EXIT_ABORTED
    except (InputError, tunix_version.UntestedTunixError) as e:
        return report_input_error(e, verbose)
    except Exception as e:
        if is_input_error(e):
            return report_input_error(e, verbose)
        raise


if __name__ == "__main__":
    sys.exit(main())
