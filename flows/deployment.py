"""The deployable FAR flow: JSON parameters in, the same DAG of stages as `far run` out.

A Prefect deployment (deploy/prefect.yaml) can only pass JSON parameters, so this flow takes
a recipe URI (a path relative to the repository, or a gs:// URI) and the `far run` overrides,
and plans the run with the same code as the CLI (pipeline/plan.py). It runs the stages inside
its own flow run, so every stage record names this flow run.

A run that stops at its session deadline (or on SIGTERM) is not a failure: the schedule's
next run continues it. Such a run ends in a COMPLETED-type state named "Incomplete" whose
message is the stop reason; its result is the RunSummary (`complete=False`). Schedules,
retries and automations treat it as success; the UI and the API show the name. An invalid
recipe or a stage error fails the flow run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from prefect import flow
from prefect.states import Completed, State
from pydantic import SecretStr

from flows.far_flow import run_recipe
from pipeline.plan import check_changed_code, completed_nodes, completed_run_summary, plan_run
from pipeline.validate import validate_run
from schemas.record import RunSummary
from stages.core.drift import Change
from stages.core.errors import InputError
from stages.core.runner import RunContext

INCOMPLETE_STATE_NAME = "Incomplete"


@flow(name="far_scheduled", log_prints=True)
def far_scheduled(
    recipe_uri: str,
    storage_root: str | None = None,
    session_budget: str | None = None,
    name: str | None = None,
    cache_dir: str | None = None,
    allow_changes: list[str] | None = None,
    lease_wait_seconds: float = 0.0,
    compile_cache: str | None = None,
) -> State[RunSummary]:
    """Run (or continue) the FAR recipe at `recipe_uri`, as `far run` would.

    Ends "Completed", or "Incomplete" (still COMPLETED-type) when the session budget ran out.

    Args:
        recipe_uri: recipe YAML, relative to the repository (recipes/...) or a gs:// URI
        storage_root: where the run lives, e.g. gs://bucket/far (default: the recipe's)
        session_budget: stop cleanly after this long, e.g. 5h45m (default: the recipe's)
        name: the run's name under storage_root (default: the recipe's)
        cache_dir: converted model weights (default: $FAR_CACHE_DIR, else ~/.cache/far)
        allow_changes: recipe/code changes accepted when continuing the run (e.g.
            ["sft.max_steps"]); any other drift from the run's recipe fails the flow run
        lease_wait_seconds: if another session holds the run's lease, wait this long for
            it, then fail naming the holder (one writer per run)
        compile_cache: JAX's persistent compilation cache, e.g. gs://bucket/far-xla, so a
            new session skips XLA compilation (default: $FAR_COMPILE_CACHE, else cache_dir)
    """
    given = {
        "recipe_uri": recipe_uri,
        "storage_root": storage_root,
        "session_budget": session_budget,
        "name": name,
        "cache_dir": cache_dir,
        "compile_cache": compile_cache,
    }
    reject_unrendered_templates(given)
    started = time.perf_counter()
    plan = plan_run(recipe_uri, storage_root, name, session_budget)
    cache = cache_dir or os.environ.get("FAR_CACHE_DIR")
    model_cache = RunContext(root="", run="", cache_dir=cache).model_cache
    key = audit_key_from(os.environ)  # this entry point's read of FAR_AUDIT_KEY
    changed: list[tuple[str, Change]] = []
    done = completed_nodes(plan.recipe, plan.root, allow_changes or (), key, changed)
    if done is not None:  # as `far run`: nothing to run, no session, nothing written
        validate_run(plan.recipe, plan.root, model_cache, computes=False)
        return final_state(completed_run_summary(plan.recipe, plan.root, done, _since(started)))
    for line in check_changed_code(changed, allow_changes or ()):
        print(line)
    validate_run(plan.recipe, plan.root, model_cache)
    summary = run_recipe(
        plan.recipe,
        plan.root,
        plan.deadline,
        cache,
        allow_changes,
        recipe_source=recipe_uri,
        lease_wait_seconds=lease_wait_seconds,
        compile_cache=compile_cache or os.environ.get("FAR_COMPILE_CACHE"),
        audit_key=key,
    )
    return final_state(summary)


def _since(started: float) -> float:
    return time.perf_counter() - started


def audit_key_from(environ: Mapping[str, str]) -> SecretStr | None:
    """The ledger's signing key from the worker's environment (never a flow parameter)."""
    key = environ.get("FAR_AUDIT_KEY")
    return SecretStr(key) if key else None


def final_state(summary: RunSummary) -> State[RunSummary]:
    """COMPLETED either way; named "Incomplete" (with the reason) when the run stopped early."""
    if summary.complete:
        return Completed(data=summary, message=f"FAR run '{summary.run}' complete")
    reason = f"stopped: {summary.stopped_reason}; the next run continues from {summary.run_uri}"
    return Completed(data=summary, name=INCOMPLETE_STATE_NAME, message=reason)


def reject_unrendered_templates(parameters: dict[str, str | None]) -> None:
    """A `{{ $VAR }}` left in a parameter means the variable was unset at `prefect deploy`.

    Left alone, "{{ $FAR_STORAGE_ROOT }}" would be taken as a relative local path.
    """
    for key, value in parameters.items():
        if value is not None and "{{" in value:
            raise InputError(
                f"parameter {key} is an unrendered template {value!r}: set the environment "
                "variable it names before `prefect deploy`, or pass the parameter to the run"
            )
