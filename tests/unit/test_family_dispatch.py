"""A model family is one module: outside stages/modeling/families/ no code tests a family's
name, and the names the recipe schema lists (which imports nothing of stages) are the
registry's."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from schemas.recipe.common import CONFIG_JSON_FAMILIES, GGUF_FAMILIES, Family, Preset
from stages.modeling import families

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("stages", "schemas", "pipeline", "flows")
FAMILY_PACKAGE = ROOT / "stages" / "modeling" / "families"
NAMES = set(families.REGISTRY)


def _family_constants(node: ast.AST) -> list[str]:
    """Family names written as a string constant in `node` (or in a tuple/list/set of them)."""
    if isinstance(node, ast.Constant) and node.value in NAMES:
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [n for elt in node.elts for n in _family_constants(elt)]
    return []


def _is_family_prefix(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and bool(node.value)
        and any(name.startswith(node.value) for name in NAMES)
    )


def dispatch_sites(source: str) -> list[tuple[int, str]]:
    """(line, what) of each test of a family's name in `source`: a comparison with a family
    name, a startswith/endswith on a family name's prefix, a dict keyed by family names."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            names = [n for part in (node.left, *node.comparators) for n in _family_constants(part)]
            if names:
                found.append((node.lineno, f"compares with {names}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
            and any(_is_family_prefix(arg) for arg in node.args)
        ):
            found.append((node.lineno, f"{node.func.attr} a family name's prefix"))
        elif isinstance(node, ast.Dict):
            keys = [n for key in node.keys if key is not None for n in _family_constants(key)]
            if keys:
                found.append((node.lineno, f"a table keyed by {keys}"))
    return found


def test_no_dispatch_on_a_family_name_outside_the_family_modules() -> None:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if FAMILY_PACKAGE in path.parents:
                continue
            sites = dispatch_sites(path.read_text(encoding="utf-8"))
            found += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in sites]
    assert found == [], (
        "code outside stages/modeling/families/ tests a model family's name; ask the family "
        "object (families.get(spec.family)) instead:\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        'if spec.family == "gemma3":\n    pass',
        'ok = family in ("qwen3", "llama3")',
        'ok = spec.family.startswith("gemma")',
        'TABLE = {"gemma3": 1, "gemma2": 2}',
    ],
)
def test_the_check_finds_each_kind_of_dispatch(source: str) -> None:
    assert dispatch_sites(source) != []


def test_the_check_passes_code_that_asks_the_family() -> None:
    source = (
        'family = families.get(spec.family)\nok = spec.preset.startswith(spec.family)\nt = "gemma"'
    )
    assert dispatch_sites(source) == []


def test_schema_family_names_are_the_registry() -> None:
    assert list(get_args(Family)) == list(families.REGISTRY)


def test_schema_presets_are_the_families_presets() -> None:
    presets = {p: f.name for f in families.REGISTRY.values() for p in f.presets}
    assert sorted(get_args(Preset)) == sorted(presets)
    assert all(preset.startswith(family) for preset, family in presets.items())  # ModelSpec's rule


def test_schema_mirrors_of_family_capabilities_are_the_registry() -> None:
    registry = families.REGISTRY.values()
    assert list(CONFIG_JSON_FAMILIES) == [f.name for f in registry if f.reads_config_json]
    assert list(GGUF_FAMILIES) == [f.name for f in registry if f.reads_gguf]


def test_every_family_is_complete_and_distinct() -> None:
    """Each registered family implements the whole interface and has its own Tunix network."""
    for name, family in families.REGISTRY.items():
        assert isinstance(family, families.ModelFamily) and family.name == name
        assert not getattr(type(family), "__abstractmethods__", None), name
    packages = [f.tunix_package for f in families.REGISTRY.values()]
    assert len(set(packages)) == len(packages)


@pytest.mark.parametrize(
    ("family", "source", "uri", "expected"),
    [
        ("gemma3", "gguf", None, "gemma"),
        ("gemma2", "hub", "google/gemma-2-2b", "gemma"),
        ("qwen3", "hub", "Qwen/Qwen3-0.6B", None),
        ("llama3", "safetensors", "/tmp/llama", None),
    ],
)
def test_the_model_card_license_is_the_familys(
    family: str, source: str, uri: str | None, expected: str | None
) -> None:
    from schemas.recipe import ModelSpec
    from stages.modeling import export_card

    spec = ModelSpec.model_validate(
        {"family": family, "source": source, "uri": uri, "tokenizer": "sentencepiece"}
        | ({"preset": "gemma3_270m"} if source == "gguf" else {})
        | ({"preset": "gemma2_2b"} if family == "gemma2" else {})
    )
    facts = export_card.CardFacts(spec, "sft", "ckpt", 1, None, "run")
    lines = export_card.front_matter(facts, adapter=False).splitlines()
    assert [line for line in lines if line.startswith("license:")] == (
        [f"license: {expected}"] if expected else []
    )
