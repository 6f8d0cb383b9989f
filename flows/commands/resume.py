"""`far resume RUN`: continue a run with the recipe its run.json holds."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flows.commands.options import (
    EXIT_INVALID,
    RUN_URI_HELP,
    add_plugin_option,
    add_session_options,
)
from flows.commands.run import run_and_report
from pipeline import manifest, plugins
from pipeline.plan import (
    plan_recipe,
)
from pipeline.recipes import (
    RecipeError,
    parse_recipe,
)
from stages.core import storage
from stages.rewards import IsolationUnavailable


def add_command(commands: Any) -> None:
    """Register `far resume`."""
    resume = commands.add_parser(
        "resume",
        help="continue RUN with the recipe it was started with",
        description="Same as re-running `far run` with the recipe stored in RUN/run.json.",
    )
    resume.add_argument("run_uri", help=RUN_URI_HELP)
    resume.add_argument("--session-budget", help="stop cleanly after this long, e.g. 9h")
    add_session_options(resume)
    add_plugin_option(resume)


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
