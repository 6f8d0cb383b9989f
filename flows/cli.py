"""The `far` command line: the parser (one module per command in flows/commands/) and `main`.

Settings are read here, once, and passed down; nothing is configured at import time.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import cast

from pydantic import SecretStr

from flows.commands import (
    audit,
    export,
    lineage,
    recipes,
    resume,
    run,
    runs,
    status,
    validate,
)
from flows.commands.console import configure_logging, configure_prefect, report_input_error
from flows.commands.options import (
    AUDIT_KEY_ENV,
    EXIT_ABORTED,
    EXIT_CODES,
    EXIT_INCOMPLETE,
    EXIT_INVALID,
    EXIT_LEASE_HELD,
    EXIT_LEASE_LOST,
    EXIT_NO_PROGRESS,
    EXIT_PROBLEMS,
)
from pipeline import plugins
from stages import registry
from stages.core.errors import InputError, is_input_error
from stages.modeling import tunix_version

__all__ = [
    "EXIT_ABORTED",
    "EXIT_INCOMPLETE",
    "EXIT_INVALID",
    "EXIT_LEASE_HELD",
    "EXIT_LEASE_LOST",
    "EXIT_NO_PROGRESS",
    "EXIT_PROBLEMS",
    "build_parser",
    "main",
    "parse_arguments",
]
log = logging.getLogger("far")

# the kinds beyond the default pipeline's (whose kinds read a recipe section when configless)
OTHER_KINDS = ", ".join(k for k, s in registry.REGISTRY.items() if s.section is None)
DESCRIPTION = f"""\
FAR (Format-Align-Reinforce) post-trains an open model to reason. A recipe names a DAG of
stages (by default data-prep -> SFT-format -> GRPO-reinforce -> evaluation; also
{OTHER_KINDS}) run as one Prefect flow.
Start with `far run smoke`."""


EPILOG = f"""\
Every stage writes its output under {{storage_root}}/{{name}}/{{node}}-{{hash}}/ and a record
(stage.json) last. Running the same recipe again skips every completed stage, so a run
that stopped (session over, machine preempted, a failure) continues where it left off.
`far COMMAND --help` explains each command.

{EXIT_CODES}"""


COMMANDS = (run, validate, status, resume, lineage, audit, recipes, runs, export)
"""Each command's module, in the order `far --help` lists them: each registers its parser
(`add_command`) and handles its arguments (`cmd_<name>`)."""

READS_A_RUN = ("status", "audit", "lineage")
"""Commands that read a run as data: they import no module, neither one the run names nor
one --plugin names (pipeline/plugin_check.py)."""


def build_parser() -> argparse.ArgumentParser:
    """The `far` parser: every command's subparser, the commands listed before the exit codes."""
    parser = argparse.ArgumentParser(
        prog="far",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"far {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_command(commands)
    return parser


def handler(command: str) -> Callable[[argparse.Namespace], int]:
    """`cmd_<command>` of flows/commands/<command>.py."""
    module = {m.__name__.rsplit(".", 1)[1]: m for m in COMMANDS}[command]
    return cast(Callable[[argparse.Namespace], int], getattr(module, f"cmd_{command}"))


def package_version() -> str:
    """The installed far package's version (the source tree's when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("far")
    except PackageNotFoundError:
        return "unknown (not installed)"


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
    """`far ARGS`: parse, configure logging and Prefect once, load --plugin modules (not for
    the commands that read a run as data), run the command; its exit code."""
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
    try:
        return int(handler(args.command)(args))
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
