"""The recipe schema is a package split by section (schemas/recipe/__init__.py): every name a
section defines is importable from `schemas.recipe` as before, each section imports only the
sections listed above it (no cycle, no section that needs them all), and none grows back into
the one 1,300-line file it was."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import schemas.recipe

PACKAGE = Path(schemas.recipe.__file__).parent
ORDER = [
    "common",
    "kinds",
    "data",
    "training",
    "grpo",
    "evaluation",
    "subsets",
    "runtime",
    "nodes",
    "recipe",
]
MAX_LINES = 400


def _sections() -> list[str]:
    return [m.name for m in pkgutil.iter_modules([str(PACKAGE)])]


def _defined(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_the_sections_are_the_documented_ones() -> None:
    assert sorted(_sections()) == sorted(ORDER)
    for section in ORDER:
        assert f"- {section}:" in (schemas.recipe.__doc__ or ""), section


def test_every_name_a_section_defines_is_reexported_as_itself() -> None:
    exported = set(schemas.recipe.__all__)
    for section in ORDER:
        module = importlib.import_module(f"schemas.recipe.{section}")
        for name in _defined(section):
            assert name in exported, f"schemas.recipe does not re-export {section}.{name}"
            assert getattr(schemas.recipe, name) is getattr(module, name), name


def test_a_section_imports_only_the_sections_above_it() -> None:
    for index, section in enumerate(ORDER):
        tree = ast.parse((PACKAGE / f"{section}.py").read_text())
        imported = {
            str(node.module)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("schemas")
        }
        allowed = {"schemas.base", *(f"schemas.recipe.{s}" for s in ORDER[:index])}
        assert imported <= allowed, f"{section} imports {sorted(imported - allowed)}"


def test_no_section_grows_back_into_one_file() -> None:
    for section in ORDER:
        lines = len((PACKAGE / f"{section}.py").read_text().splitlines())
        assert lines <= MAX_LINES, f"schemas/recipe/{section}.py has {lines} lines; split it"
