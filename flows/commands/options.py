"""The exit codes and the options several `far` commands share (a recipe and its overrides,
a session's options, --json, --expect-root), so each command's module states only its own.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from pydantic import BaseModel

from schemas import cli_output
from stages.core import ledger

EXIT_PROBLEMS = 1  # `far audit` found problems; also a defect or outage (with its traceback)
EXIT_INVALID = 2
EXIT_INCOMPLETE = 3
EXIT_LEASE_HELD = 4  # another session holds the run's lease (one writer per run)
EXIT_LEASE_LOST = 5  # this session lost the run's lease to another one and stopped at once
EXIT_NO_PROGRESS = 6  # stopped at the deadline before any stage committed or took a step
EXIT_ABORTED = 130  # a second Ctrl-C (or one outside a run's stages): no save
AUDIT_KEY_ENV = "FAR_AUDIT_KEY"  # signs (far run) and verifies (far audit) the run's ledger

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

RUN_URI_HELP = "the run: {storage_root}/{name}, e.g. runs/smoke"


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """The recipe, its KEY=VALUE overrides, --root and --name: what `far run` and
    `far validate` share."""
    parser.add_argument(
        "recipe",
        help="recipe YAML: a path, file://, gs:// or memory:// URI, or a bundled recipe's name\n"
        "(`far recipes` lists them), e.g. smoke",
    )
    add_override_argument(parser)
    parser.add_argument("--root", help="override the recipe's storage_root (path or URI)")
    parser.add_argument("--name", help="override the recipe's run name")
    add_plugin_option(parser)


def add_plugin_option(parser: argparse.ArgumentParser) -> None:
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


def add_plugin_check_option(parser: argparse.ArgumentParser) -> None:
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


def add_override_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="change a recipe field by its dotted path before validation, e.g.\n"
        "sft.max_steps=20 grpo.rewards='{answer_match: 1.0}' (values are YAML); recorded\n"
        "in run.json as given; on an existing run the drift guard treats it as a recipe edit",
    )


def wait_seconds(text: str) -> float:
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


def add_session_options(parser: argparse.ArgumentParser) -> None:
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
        type=wait_seconds,
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
    add_common_options(parser)


def add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="show library logs too")
    parser.add_argument(
        "--allow-untested-tunix",
        action="store_true",
        help="run with a google-tunix version FAR's workarounds were not tested with\n"
        "(logged as a warning; default: refuse with both versions named)",
    )


def add_json_option(parser: argparse.ArgumentParser, model: type[Any]) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print one JSON object instead ({model.__name__}, schema_version "
        f"{cli_output.SCHEMA_VERSION};\nits fields: docs/reference/json.md)",
    )


def print_json(output: BaseModel) -> None:
    print(output.model_dump_json(indent=2))


def add_root_options(parser: argparse.ArgumentParser) -> None:
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


def expected_root(args: argparse.Namespace) -> str | None:
    """--expect-root, checked to be a root (a bad one is exit 2, one line, not tampering)."""
    if args.expect_root is None:
        if args.accept_later:
            raise ledger.BadRoot("--accept-later: accepts entries after --expect-root; give both")
        return None
    return ledger.check_root(args.expect_root)
