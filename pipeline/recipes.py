"""Load a recipe YAML from any storage location and validate it in full, naming bad fields."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import ValidationError

from pipeline.dag import DagError, build_dag
from schemas.recipe import Recipe
from stages.core import storage
from stages.core.errors import InputError


class RecipeError(InputError):
    """A recipe that cannot be used; the message lists every bad field."""


class DuplicateKey(yaml.YAMLError):
    """A YAML mapping that names one key twice."""


_MERGE_TAG = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last
    value silently, so `lr: 1e-4` written twice in a section would hide the first). Merge keys
    (`<<: *defaults`) still merge: the keys written in the mapping itself are checked before
    the merge, and override the merged ones as YAML says."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            merge = key_node.tag == _MERGE_TAG  # `<<`: no value of its own to construct
            key = "<<" if merge else self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKey(
                    f"duplicate key {key!r} at line {line} (first at line {seen[key]}); "
                    f"keep one of them"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """YAML text as Python values, refusing duplicate mapping keys."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass


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


def parse_assignments(assignments: Sequence[str]) -> list[tuple[list[str], Any]]:
    """`sft.max_steps=20` -> (["sft", "max_steps"], 20): the value is read as YAML, so numbers,
    booleans, null, lists ([a, b]) and mappings ({k: v}) work as they do in the recipe file."""
    parsed = []
    for item in assignments:
        path, sep, raw = item.partition("=")
        keys = path.strip().split(".")
        if not sep or not all(k.strip() for k in keys):
            raise RecipeError(
                f"override {item!r}: expected KEY=VALUE with a dotted key, e.g. sft.max_steps=20"
            )
        try:
            value = load_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise RecipeError(f"override {item!r}: the value is not valid YAML: {e}") from e
        parsed.append(([k.strip() for k in keys], value))
    return parsed


def apply_assignments(data: Any, assignments: Sequence[str], source: str) -> Any:
    """The recipe mapping with each `dotted.key=value` set (a copy; the schema checks it)."""
    if not assignments:
        return data
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {source} must be a YAML mapping, got {type(data).__name__}")
    out = copy.deepcopy(data)
    for keys, value in parse_assignments(assignments):
        node = out
        for depth, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                where = ".".join(keys[: depth + 1])
                raise RecipeError(
                    f"override {'.'.join(keys)}: {where} is {child!r}, not a mapping of fields"
                )
            node = child
        node[keys[-1]] = value
    return out


def load_recipe(
    uri: str, overrides: dict[str, Any] | None = None, assignments: Sequence[str] = ()
) -> Recipe:
    """Read and validate `uri`; `overrides` replace top-level fields (e.g. storage_root) and
    `assignments` (`sft.max_steps=20`) any field by its dotted path, before validation."""
    try:
        text = storage.read_text(uri)
    except IsADirectoryError as e:
        raise RecipeError(f"recipe {uri} is a directory; expected a recipe YAML file") from e
    except FileNotFoundError as e:
        raise RecipeError(f"recipe not found: {uri}") from e
    except UnicodeDecodeError as e:
        raise RecipeError(f"recipe {uri} is not UTF-8 text: {e}") from e
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise RecipeError(f"recipe {uri} is not valid YAML: {e}") from e
    return parse_recipe(apply_assignments(data, assignments, uri), uri, overrides)
