"""`far validate RECIPE`: every check `far run` makes before compute, then the plan."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from flows.commands.options import (
    EXIT_INVALID,
    add_json_option,
    add_recipe_arguments,
    add_session_options,
    print_json,
)
from pipeline.plan import (
    NodePlan,
    completed_nodes,
    plan_run,
    preview,
    render_preview,
    with_models,
)
from pipeline.recipes import (
    resolve_recipe_uri,
)
from pipeline.validate import check_session_budget, ignored_eval_models, validate_run
from schemas import cli_output
from stages.core import storage
from stages.core.runner import RunContext
from stages.rewards import IsolationUnavailable


def add_command(commands: Any) -> None:
    """Register `far validate`."""
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
    add_recipe_arguments(validate)
    validate.add_argument(
        "--session-budget", help="as for `far run`: checked like the recipe's session_budget"
    )
    add_session_options(validate)  # every `far run` option, so a run line checks as it is
    add_json_option(validate, cli_output.ValidateOutput)


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
    with storage.reads_once():  # one pass over the run: each check reads what it has read
        done = completed_nodes(plan.recipe, plan.root, args.allow_change, args.audit_key)
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
