"""What `far run` and the scheduled deployment share: turning a recipe URI plus overrides into
a validated run plan (recipe, normalized storage root, session deadline).

Both entry points go through `plan_run`, so a recipe that `far run` accepts is accepted by the
deployment with the same overrides, and the deadline is counted from the same moment (once the
recipe is valid, before any stage starts). No Prefect and no JAX here: it stays cheap to import.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.recipes import load_recipe
from schemas.recipe import Recipe
from stages import rewards
from stages.core import storage


@dataclass(frozen=True)
class RunPlan:
    recipe: Recipe
    root: str  # the recipe's storage_root, normalized (absolute path or URI)
    deadline: float | None  # epoch seconds when the session budget runs out; None: no budget


def plan_run(
    recipe_uri: str,
    storage_root: str | None = None,
    name: str | None = None,
    session_budget: str | None = None,
    assignments: Sequence[str] = (),
) -> RunPlan:
    """Load and validate `recipe_uri` with overrides (None keeps the recipe's value) and
    dotted-path `assignments` (`sft.max_steps=20`), validated by the same schema.

    Raises pipeline.recipes.RecipeError naming every bad field.
    """
    overrides = {"storage_root": storage_root, "name": name, "session_budget": session_budget}
    return plan_recipe(load_recipe(recipe_uri, overrides, assignments))


def plan_recipe(recipe: Recipe) -> RunPlan:
    """The plan for an already validated recipe (e.g. the one stored in a run's run.json).

    Raises rewards.IsolationUnavailable when this machine cannot sandbox the run's rewards
    and evaluation at the recipe's isolation level (every run evaluates, so every run needs it).
    """
    rewards.require_isolation(recipe.sandbox.isolation)
    budget = recipe.session_budget
    deadline = time.time() + budget.total_seconds() if budget is not None else None
    return RunPlan(recipe, storage.normalize(recipe.storage_root), deadline)
