"""The stage-author API (what a stage module imports from stages/core/runner.py, its
`__all__`, and the modules that define those names) documents every public function: an
`Args:` section when it takes arguments and a `Returns:` section, Google style."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator

from stages.core import context, identity, runner

API_MODULES = (runner, identity, context)


def _public_functions() -> Iterator[tuple[str, Callable[..., object]]]:
    """Each public function and method of the API: runner's `__all__`, and every public
    function and method of the modules that define them."""
    names = {(runner.__name__, name) for name in runner.__all__}
    names |= {
        (module.__name__, name)
        for module in (identity, context)
        for name in vars(module)
        if not name.startswith("_")
    }
    for module_name, name in sorted(names):
        module = {m.__name__: m for m in API_MODULES}[module_name]
        value = getattr(module, name)
        if getattr(value, "__module__", None) not in {m.__name__ for m in API_MODULES}:
            continue  # imported from elsewhere (storage, drift, schemas)
        if inspect.isfunction(value):
            yield f"{value.__module__}.{name}", value
        elif inspect.isclass(value):
            for attr, member in vars(value).items():
                if inspect.isfunction(member) and not attr.startswith("_"):
                    yield f"{value.__module__}.{name}.{attr}", member


def _parameters(function: Callable[..., object]) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p not in ("self", "cls")]


def test_the_api_is_what_stage_modules_use() -> None:
    """The names a stage author reaches for are in runner's `__all__`, under plain names."""
    for name in (
        "RunContext",
        "StageIdentity",
        "StageOutcome",
        "StageWouldRun",
        "SessionExpired",
        "run_stage",
        "run_stage_on_artifacts",
        "stage_identity",
        "require_input",
        "optional_input",
    ):
        assert name in runner.__all__, name
        assert hasattr(runner, name), name


def test_every_public_function_has_args_and_returns_sections() -> None:
    found = dict(_public_functions())
    assert {"stages.core.runner.run_stage", "stages.core.context.RunContext.seconds_left"} <= set(
        found
    )  # the walk reaches functions and methods
    missing = []
    for where, function in found.items():
        doc = inspect.getdoc(function) or ""
        if _parameters(function) and "\nArgs:\n" not in doc:
            missing.append(f"{where}: no Args: section")
        if "\nReturns:\n" not in doc:
            missing.append(f"{where}: no Returns: section")
    assert not missing, "\n".join(missing)
