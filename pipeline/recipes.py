"""Load a recipe YAML from any storage location and validate it in full, naming bad fields."""

from __future__ import annotations

import copy
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from pipeline import plugins
from pipeline.dag import DagError, build_dag
from schemas.recipe import Recipe
from stages.core import storage
from stages.core.errors import InputError, MissingInput, closest


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
        hint = _did_you_mean(item["loc"]) if item["type"] == "extra_forbidden" else ""
        lines.append(f"  {path}: {item['msg']} (got {shown}){hint}")
    return "\n".join(lines)


def _did_you_mean(loc: tuple[int | str, ...]) -> str:
    """`; did you mean max_steps?` for an unknown field close to one of its section's fields
    (the sections the path can reach: a pipeline node's path names its kind, not a field)."""
    models: set[type[BaseModel]] = {Recipe}
    for key in loc[:-1]:
        owners = [m for m in models if isinstance(key, str) and key in m.model_fields]
        if owners:  # else a list index or a node's kind tag: the same sections
            models = {n for m in owners for n in _models_in(m.model_fields[str(key)].annotation)}
    names = sorted({name for m in models for name in m.model_fields})
    close = closest(str(loc[-1]), names)
    return f"; did you mean {close}?" if close else ""


def _models_in(annotation: Any) -> set[type[BaseModel]]:
    """The models a field holds: itself, a union's members, a list's or dict's items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {annotation}
    if get_origin(annotation) is typing.Literal:
        return set()
    return {m for arg in get_args(annotation) for m in _models_in(arg)}


def parse_recipe(data: Any, source: str, overrides: dict[str, Any] | None = None) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {source} must be a YAML mapping, got {type(data).__name__}")
    merged = {**data, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    try:
        recipe = Recipe.model_validate(merged)
    except ValidationError as e:
        raise RecipeError(f"recipe {source} is invalid:\n{describe(e)}") from e
    plugins.load_plugins(recipe.plugins, f"recipe {source}: plugins")  # before its kinds are read
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
        raise RecipeError(f"recipe not found: {uri}{_recipe_hint(uri)}") from e
    except UnicodeDecodeError as e:
        raise RecipeError(f"recipe {uri} is not UTF-8 text: {e}") from e
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise RecipeError(f"recipe {uri} is not valid YAML: {e}") from e
    return parse_recipe(apply_assignments(data, assignments, uri), uri, overrides)


# ---- the bundled recipes (`far recipes`) ---------------------------------------------------

BUNDLED = storage.normalize(str(Path(__file__).resolve().parent.parent / "recipes"))
"""The recipes shipped beside the code (the checkout's, or an editable install's, recipes/)."""


class UnknownRecipe(InputError):
    """`far recipes copy NAME`: no bundled recipe has that name."""


class CopyTargetExists(InputError):
    """`far recipes copy NAME DEST`: DEST (or DEST/NAME.yaml) exists; it is never overwritten."""


def bundled_recipes(folder: str = BUNDLED) -> dict[str, str]:
    """Each bundled recipe's name (its file's stem) -> its first comment line, without the
    `# ` and a repeated `name: `; sorted by name."""
    if not storage.is_dir(folder):
        raise MissingInput(
            f"no bundled recipes at {folder}: this install has no recipes/ folder (use a "
            f"checkout of FAR, or an editable install of one)"
        )
    names = sorted(rel for rel in storage.list_files(folder) if rel.endswith(".yaml"))
    found = {}
    for rel in names:
        name = rel.removesuffix(".yaml")
        first = next(
            (line for line in storage.read_text(storage.join(folder, rel)).splitlines()), ""
        )
        summary = first.lstrip("#").strip() if first.startswith("#") else ""
        found[name] = summary.removeprefix(f"{name}:").strip()
    return found


def resolve_recipe_uri(uri: str, folder: str = BUNDLED) -> str:
    """The recipe `far run RECIPE` means: `uri` itself when it names a file, else the bundled
    recipe of that name (`smoke`, `smoke.yaml`), else `uri` (whose reading then fails, with
    a suggestion)."""
    if "/" in uri or storage.exists(storage.normalize(uri)):
        return uri
    bundled = storage.join(folder, f"{uri.removesuffix('.yaml')}.yaml")
    return bundled if storage.exists(bundled) else uri


def _recipe_hint(uri: str) -> str:
    """ "; did you mean X?" for a recipe path that is not there: the closest .yaml beside it,
    else the closest bundled recipe's name; and where the bundled ones are listed."""
    parent, _, base = storage.normalize(uri).rpartition("/")
    near = [n for n in storage.list_names(parent) if n.endswith((".yaml", ".yml"))]
    close = closest(base, near)
    if close:
        shown = uri.rpartition("/")[0]
        return f"; did you mean {shown + '/' if shown else ''}{close}?"
    names = list(bundled_recipes()) if storage.is_dir(BUNDLED) else []
    close = closest(base.removesuffix(".yaml"), names)
    named = f"; did you mean the bundled recipe {close!r} (`far run {close}`)?" if close else ""
    return named + " (`far recipes` lists the bundled recipes)"


def copy_bundled(name: str, dest: str, folder: str = BUNDLED) -> str:
    """Copy bundled recipe `name` to `dest` (a file, or an existing directory: DEST/NAME.yaml),
    never over an existing file; the URI written."""
    known = bundled_recipes(folder)
    name = name.removesuffix(".yaml")
    if name not in known:
        close = closest(name, known)
        hint = f"did you mean {close}? " if close else ""
        raise UnknownRecipe(
            f"no bundled recipe {name!r}; {hint}recipes: {', '.join(known)} (`far recipes` "
            f"lists them)"
        )
    target = storage.normalize(dest)
    if storage.is_dir(target):
        target = storage.join(target, f"{name}.yaml")
    text = storage.read_text(storage.join(folder, f"{name}.yaml"))
    if not storage.create_exclusive(target, text.encode()):
        raise CopyTargetExists(
            f"{target} exists; far recipes copy never overwrites a file: give another DEST "
            f"(or remove it first)"
        )
    return target
