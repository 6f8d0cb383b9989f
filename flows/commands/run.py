"""`far run RECIPE`: validate a recipe, run its DAG as a Prefect flow (or answer a complete
run from its records), and print the summary; `far resume` shares its path.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import httpx

from flows import console_summary, prefect_server
from flows.commands.console import (
    EPHEMERAL_STARTUP_SECONDS,
    EPHEMERAL_TIMEOUT_TEXT,
    STARTUP_ENV,
    quiet_prefect_console,
    report_prefect_start_failure,
)
from flows.commands.options import (
    EXIT_CODES,
    EXIT_INCOMPLETE,
    EXIT_INVALID,
    EXIT_LEASE_HELD,
    EXIT_LEASE_LOST,
    EXIT_NO_PROGRESS,
    add_recipe_arguments,
    add_session_options,
)
from pipeline import manifest
from pipeline.dag import build_dag
from pipeline.lease import LeaseHeld
from pipeline.plan import (
    CompletedNode,
    RunPlan,
    check_changed_code,
    completed_nodes,
    completed_run_summary,
    plan_run,
)
from pipeline.recipes import (
    RecipeError,
    resolve_recipe_uri,
)
from pipeline.validate import check_session_budget, validate_run
from schemas.record import RunSummary
from stages.core import drift, storage
from stages.core.runner import RunContext
from stages.core.sessions import LeaseLost, SaveFailed
from stages.modeling import tunix_version
from stages.rewards import IsolationUnavailable

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


def add_command(commands: Any) -> None:
    """Register `far run`."""
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
    add_recipe_arguments(run)
    run.add_argument(
        "--session-budget", help="stop cleanly after this long, e.g. 9h, 90m (overrides recipe)"
    )
    add_session_options(run)


def cmd_run(args: argparse.Namespace) -> int:
    args.recipe = resolve_recipe_uri(args.recipe)  # a bundled recipe's name: `far run smoke`
    try:
        plan = plan_run(args.recipe, args.root, args.name, args.session_budget, args.overrides)
    except (RecipeError, IsolationUnavailable) as e:
        print(f"far: {e}", file=sys.stderr)
        return EXIT_INVALID
    return run_and_report(plan, args.recipe, args)


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
        done = completed_nodes(plan.recipe, plan.root, args.allow_change, args.audit_key, changed)
        if done is not None:
            validate_run(plan.recipe, plan.root, cache_dir, computes=False)
            return report_completed(plan, done, time.perf_counter() - started)
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


def report_completed(plan: RunPlan, done: list[CompletedNode], seconds: float) -> int:
    """The summary of a run that is already complete, from its records: no session is started
    (no Prefect, no JAX, nothing written), so run.json and the ledger root stay as they were."""
    print_summary(
        completed_run_summary(plan.recipe, plan.root, done, seconds),
        note="Nothing to run: every stage is complete and verified against its record and the "
        "ledger; no session was started, so run.json and the ledger root are unchanged.",
    )
    return 0


def print_summary(summary: RunSummary, note: str = "") -> None:
    """The run's titled summary block (flows/console_summary.py), `note` under its stages."""
    print("\n".join(console_summary.summary_lines(summary, note=note)))


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
