"""The stage registry (stages/registry.py) is the one place a stage kind is declared: every
node class of the recipe schema has a registration with its config model and vice versa, every
entry point has the uniform shape, the import contract lists exactly the registered stages, and
the declared "hashed only when set" rule keeps old stage hashes while a set field moves them.
"""

from __future__ import annotations

import inspect
import tomllib
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import Field

from pipeline.plan import stage_version
from schemas.base import Frozen
from schemas.recipe import (
    REGISTERED,
    SHIPPED_KINDS,
    SHIPPED_NODES,
    EvalConfig,
    HardSubsetConfig,
    RegisteredNode,
    StageNode,
    node_class,
)
from stages import registry
from stages.core.runner import StageIdentity

REPO = Path(__file__).resolve().parents[2]


def test_every_shipped_node_class_has_a_builtin_registration_with_its_config_model() -> None:
    assert set(SHIPPED_NODES) == {spec.kind for spec in registry.BUILTIN}
    for kind, node in SHIPPED_NODES.items():
        config = node.model_fields["config"].annotation
        assert registry.spec(kind).config in (config, *typing.get_args(config)), kind


def test_each_node_class_is_tagged_with_its_kind() -> None:
    """StageNode's tags route a YAML node by its kind; a shipped class under another tag would
    read a node of one kind with another kind's config."""
    for tagged in typing.get_args(typing.get_args(StageNode)[0]):
        node, tag = typing.get_args(tagged)
        if tag.tag == REGISTERED:
            assert node is RegisteredNode
        else:
            assert typing.get_args(node.model_fields["kind"].annotation) == (tag.tag,)


def test_every_entry_point_has_the_uniform_shape() -> None:
    for spec in registry.REGISTRY.values():
        entry = spec.entry_point()  # imports the stage (JAX, Tunix): seconds, once
        assert list(inspect.signature(entry).parameters) == ["inputs", "config", "ctx"], spec
        assert stage_version(spec.kind) is not None, spec.kind  # `far validate` finds its code


def _contracts() -> list[dict[str, object]]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = pyproject["tool"]["importlinter"]["contracts"]
    return contracts


def _stage_packages() -> set[str]:
    """What the import contract must name as stages: each built-in entry point's package."""
    return {".".join(spec.module.split(".")[:2]) for spec in registry.BUILTIN}


def test_the_import_contract_lists_exactly_the_registered_stages_and_shared_layers() -> None:
    by_name = {str(c["name"]): c for c in _contracts()}
    independent = set(by_name["A stage never imports another stage"]["modules"])
    shared = by_name["The shared layers (core, modeling, rewards) never import a stage"]
    assert independent == _stage_packages()
    assert set(shared["forbidden_modules"]) == _stage_packages()
    assert tuple(shared["source_modules"]) == registry.SHARED_LAYERS
    registry_name = next(n for n in by_name if n.startswith("The stage registry"))
    imports_none_of = set(by_name[registry_name]["forbidden_modules"])
    # the registry reads stages.core (InputError) and nothing above it
    assert _stage_packages() | set(registry.SHARED_LAYERS[1:]) <= imports_none_of


def test_everything_under_stages_is_a_stage_kind_a_shared_layer_or_the_registry() -> None:
    """A new package or module directly under stages/ must be declared: registered as a kind
    (BUILTIN), or added to registry.SHARED_LAYERS (and then to the import contract)."""
    declared = _stage_packages() | set(registry.SHARED_LAYERS) | {"stages.registry"}
    found = {
        f"stages.{path.stem}"
        for path in (REPO / "stages").iterdir()
        if (path.is_dir() and (path / "__init__.py").exists())
        or (path.suffix == ".py" and path.name != "__init__.py")
    }
    assert found == declared, (
        f"undeclared: {sorted(found - declared)}; declared but missing: {sorted(declared - found)}"
    )


def test_the_long_stages_report_progress() -> None:
    progress = {k for k, s in registry.REGISTRY.items() if s.progress}
    assert progress == {"sft", "grpo", "evaluate"}


def test_a_kind_is_registered_once_and_a_registration_is_undone() -> None:
    spec = registry.StageSpec("toy", EvalConfig, "stages.evaluate.evaluation:run", "eval_report")
    with pytest.raises(ValueError, match="'sft' is registered already"):
        registry.register(registry.spec("sft"))
    with registry.registered(spec):
        assert registry.spec("toy") is spec
    typo = registry.StageSpec(
        "toy", EvalConfig, "x:run", "eval_report", hash_exempt_defaults=("greedyy",)
    )
    with pytest.raises(ValueError, match=r"\['greedyy'\] are not fields of EvalConfig"):
        registry.register(typo)
    with pytest.raises(registry.UnknownStageKind, match="no stage kind 'toy'"):
        registry.spec("toy")
    scored = {"evaluation": registry.Port(("eval_report",), trains_on_scored=True)}
    no_dataset = registry.StageSpec("toy", HardSubsetConfig, "x:run", "dataset", scored)
    with pytest.raises(ValueError, match="needs a 'dataset' port"):
        registry.register(no_dataset)
    with pytest.raises(ValueError, match="'sft' is built in"):
        registry.unregister("sft")


# ---- "hashed only when set" ------------------------------------------------------------------


class ToyV1(Frozen):
    """A stage's config as first released."""

    steps: int = 3
    """Steps."""


class ToyV2(ToyV1):
    """The same config after a release added a field (its default: the old behaviour)."""

    warmup: int = 0
    """Added later."""
    tags: list[str] = Field(default_factory=list)
    """Added later too (a default factory)."""


@pytest.fixture
def toy_hash() -> Iterator[typing.Callable[[Frozen, tuple[str, ...]], str]]:
    def digest(config: Frozen, exempt: tuple[str, ...]) -> str:
        spec = registry.StageSpec(
            "toy", type(config), "x:run", "dataset", hash_exempt_defaults=exempt
        )
        with registry.registered(spec):
            hashed = {"toy": registry.hashed_config("toy", config)}
        return StageIdentity("toy", 1, hashed, {"dataset": "a" * 64}).digest

    yield digest


def test_a_new_field_at_its_default_leaves_the_stage_hash(
    toy_hash: typing.Callable[[Frozen, tuple[str, ...]], str],
) -> None:
    before = toy_hash(ToyV1(steps=5), ())
    assert toy_hash(ToyV2(steps=5), ("warmup", "tags")) == before
    assert toy_hash(ToyV2(steps=5), ()) != before  # undeclared, the new field moves every hash


@pytest.mark.parametrize("changed", [{"warmup": 2}, {"tags": ["x"]}])
def test_a_new_field_set_off_its_default_moves_the_stage_hash(
    toy_hash: typing.Callable[[Frozen, tuple[str, ...]], str], changed: dict[str, object]
) -> None:
    before = toy_hash(ToyV1(steps=5), ())
    assert toy_hash(ToyV2(steps=5, **changed), ("warmup", "tags")) != before


def test_the_builtin_kinds_declare_the_fields_they_hash_only_when_set() -> None:
    assert registry.spec("evaluate").hash_exempt_defaults == (
        "split",
        "greedy",
        "rewards",
        "steps",
        "max_prompts",
        "draw",
        "tag",
    )
    assert registry.spec("self_teach").hash_exempt_defaults == ("draw",)
    assert registry.spec("pick").hash_exempt_defaults == ("max_p", "correction")
    for kind in ("sft", "distill"):
        assert registry.spec(kind).hash_exempt_defaults == ("keep_checkpoints",)
    assert registry.spec("dpo").hash_exempt_defaults == ("keep_checkpoints", "logprobs")
    assert registry.spec("grpo").hash_exempt_defaults == (
        "flat_groups",
        "keep_checkpoints",
        "baseline",
        "trim_padding",
        "skip_flat_groups",
        "draw",
        "share_prompts",
        "sampler_projection",
        "oversample",
    )
    assert registry.spec("hard_subset").hash_exempt_defaults == (
        "above",
        "by",
        "select",
        "right_share",
        "gold_sft",
    )
    plain = registry.hashed_config("evaluate", EvalConfig())
    assert not {"split", "greedy", "rewards", "steps", "max_prompts", "draw", "tag"} & set(plain)
    greedy = EvalConfig(samples=4, temperature=0.8, greedy=True, split="grpo_train")
    assert {"split": "grpo_train", "greedy": True}.items() <= registry.hashed_config(
        "evaluate", greedy
    ).items()
    subset = registry.hashed_config("hard_subset", HardSubsetConfig(model="sft", above=0.0))
    assert subset["above"] == 0.0 and "by" not in subset


def test_a_shipped_kind_is_one_declaration_registered_once_like_a_plugged_in_one() -> None:
    """Each shipped kind is one StageSpec (config model, ports, entry point), the same type a
    plugin registers, declared beside its config model: the registry's BUILTIN is exactly
    those declarations, registered through the same `register`, and the schema's node union
    is assembled from them, so both name the same kinds with the same config models."""
    assert registry.BUILTIN is SHIPPED_KINDS
    for spec in SHIPPED_KINDS:
        assert type(spec) is registry.StageSpec
        assert registry.REGISTRY[spec.kind] is spec
    tags = [typing.get_args(t)[1].tag for t in typing.get_args(typing.get_args(StageNode)[0])]
    assert tags == [*(spec.kind for spec in SHIPPED_KINDS), REGISTERED]
    for spec in SHIPPED_KINDS:
        config = SHIPPED_NODES[spec.kind].model_fields["config"]
        assert spec.config in (config.annotation, *typing.get_args(config.annotation))
        if spec.section is not None:  # None: the recipe's section
            assert config.default is None and f"`{spec.section}`" in str(config.description)
        else:
            assert config.is_required() == any(
                f.is_required() for f in spec.config.model_fields.values()
            ), spec.kind


class _NewConfig(Frozen):
    """A kind's config."""

    keep: int = Field(default=4, gt=0)
    """Rows kept."""


def test_a_new_shipped_kind_needs_only_its_declaration() -> None:
    """The node class a declaration makes reads a YAML node of its kind and names a bad
    config's field, with nothing else written for it."""
    spec = registry.StageSpec("first_rows", _NewConfig, "stages.first_rows:run", "dataset")
    node = node_class(spec)
    assert node.__name__ == "FirstRowsNode"
    read = node.model_validate({"id": "first", "kind": "first_rows", "config": {"keep": 2}})
    assert read.config == _NewConfig(keep=2)
    assert node.model_validate({"id": "first", "kind": "first_rows"}).config == _NewConfig()
    with pytest.raises(ValueError, match=r"config\.keep\n  Input should be greater than 0"):
        node.model_validate({"id": "first", "kind": "first_rows", "config": {"keep": 0}})
    with pytest.raises(ValueError, match="kind"):
        node.model_validate({"id": "first", "kind": "sft", "config": {}})
