"""pyproject's filterwarnings: a warning raised from FAR's own packages fails the test that
triggers it (so a new one is fixed, not scrolled past), while the filtered third-party
deprecations stay quiet and any other third-party warning is still reported."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest


def warner(module: str, message: str) -> Callable[[], None]:
    """A function whose warnings Python attributes to `module` (as code in that module)."""
    source = f"import warnings\ndef warn():\n    warnings.warn({message!r}, DeprecationWarning)\n"
    namespace: dict[str, object] = {"__name__": module}
    exec(compile(source, f"<{module}>", "exec"), namespace)
    return namespace["warn"]  # type: ignore[return-value]


@pytest.mark.parametrize(
    "module",
    ["schemas.recipe", "stages.sft", "stages.modeling.models", "pipeline.dag", "flows.cli"],
)
def test_a_warning_from_far_code_fails_the_test(module: str) -> None:
    with pytest.raises(DeprecationWarning, match="something new"):
        warner(module, "something new is deprecated")()


def test_a_third_party_warning_is_reported_not_raised() -> None:
    with pytest.warns(DeprecationWarning, match="something new"):
        warner("tunix.sft.peft_trainer", "something new is deprecated")()


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (
            "qwix._src.utils.flax_util",
            "'VariableState' was removed, this is just an alias to 'Variable'.",
        ),
        ("flax.nnx.variablelib", "'sharding' is deprecated, use 'out_sharding' instead."),
        (
            "optax._src.linear_algebra",
            "optax.global_norm is deprecated in favor of optax.tree.norm",
        ),
        (
            "qwix._src.model",
            "The 'm.iter_modules()' method is deprecated; "
            "use the 'nnx.iter_modules(m)' function instead.",
        ),
        (
            "tunix.models.gemma3.model",
            "Using 'Module.sow()' outside of 'nnx.capture()' is deprecated; see the guide",
        ),
    ],
)
def test_a_filtered_third_party_deprecation_is_silent(module: str, message: str) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warner(module, message)()
    assert seen == []


def test_tunixs_with_mesh_in_far_code_is_still_allowed() -> None:
    """FAR enters `with mesh:` on purpose (Tunix 0.1.7 reads the mesh from it): filtered by
    message, which wins over the error filter for FAR's modules."""
    with warnings.catch_warnings(record=True) as seen:
        warner(
            "stages.modeling.models",
            "`with mesh:` context manager has been deprecated. "
            "Please use `with jax.set_mesh(mesh):` instead.",
        )()
    assert seen == []
