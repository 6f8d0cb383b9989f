"""`far recipes`: the bundled recipes, each with its description, or a copy of one to edit."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.recipes import (
    BUNDLED,
    bundled_recipes,
    copy_bundled,
)


def add_command(commands: Any) -> None:
    """Register `far recipes`."""
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
