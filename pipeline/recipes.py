"""Load a recipe YAML from any storage location and validate it in full, naming bad fields."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from pipeline.dag import DagError, build_dag
from schemas.recipe import Recipe
from stages.core import storage


class RecipeError(ValueError):
    """A recipe that cannot be used; the message lists every bad field."""


def describe(error: ValidationError) -> str:
    """One line per problem: the dotted field path, what is wrong, and the value given."""
    lines = []
    for item in error.errors():
        path = ".".join(str(p) for p in item["loc"]) or "(recipe)"
        given = item.get("input")
        shown = repr(given) if not isinstance(given, dict) else "{...}"
        lines.append(f"  {path}: {item['msg']} (got {shown})")
    return "\n".join(lines)


def parse_recipe(data: Any, source: str, overrides: dict[str, Any] | None = None) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {source} must be a YAML mapping, got {type(data).__name__}")
    merged = {**data, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    try:
        recipe = Recipe.model_validate(merged)
    except ValidationError as e:
        raise RecipeError(f"recipe {source} is invalid:\n{describe(e)}") from e
    try:
        build_dag(recipe)
    except DagError as e:
        raise RecipeError(f"recipe {source} has an invalid pipeline: {e}") from e
    return recipe


def load_recipe(uri: str, overrides: dict[str, Any] | None = None) -> Recipe:
    """Read and validate `uri`; `overrides` replace top-level fields (e.g. storage_root)."""
    try:
        text = storage.read_text(uri)
    except FileNotFoundError as e:
        raise RecipeError(f"recipe not found: {uri}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RecipeError(f"recipe {uri} is not valid YAML: {e}") from e
    return parse_recipe(data, uri, overrides)
