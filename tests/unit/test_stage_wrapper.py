"""The shape every stage with upstream inputs shares, written once in stages/core/runner.py:
`stage_identity` hashes the config (under its key), the model, the inputs' fingerprints and the
user code; `run_stage_on_artifacts` records the inputs' URIs under the same names and runs
`run_stage`.

Real `run_stage` calls on local storage whose work writes one small file (no training)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from schemas.artifacts import CheckpointArtifact
from stages import registry
from stages.core import storage
from stages.core.runner import RunContext, StageIdentity, run_stage_on_artifacts, stage_identity
from tests.conftest import recipe_with


def _checkpoint(root: Path | str, name: str) -> CheckpointArtifact:
    uri = storage.join(str(root), "upstream", name)
    storage.write_bytes(storage.join(uri, "w"), name.encode())
    return CheckpointArtifact(
        uri=uri,
        step=1,
        model=recipe_with("/tmp/unused").model,
        tokenizer="byte",
        lora=None,
        size_bytes=len(name),
        fingerprint=storage.tree_fingerprint(uri),
    )


def _work(directory: str) -> tuple[CheckpointArtifact, dict[str, float], dict[str, list[float]]]:
    return _checkpoint(directory, "out"), {}, {}


def test_stage_identity_is_the_shape_each_stage_hashed_by_hand() -> None:
    model = recipe_with("/tmp/unused").model
    built = stage_identity(
        "evaluate",
        3,
        {"split": "eval"},
        {"dataset": "d" * 64, "sft": "s" * 64},
        model=model,
        key="eval",
        code={"reward:mine": "c" * 64},
    )
    by_hand = StageIdentity(
        "evaluate",
        3,
        {"eval": {"split": "eval"}, "model": model.model_dump(mode="json")},
        {"dataset": "d" * 64, "sft": "s" * 64, "reward:mine": "c" * 64},
    )
    assert built == by_hand
    assert list(built.config) == ["eval", "model"] and list(built.inputs) == list(by_hand.inputs)
    assert stage_identity("pick", 1, {}, {}).config == {"pick": {}}  # no model: none hashed


def test_run_on_records_each_input_uri_under_its_name(tmp_path: Path) -> None:
    policy, teacher = _checkpoint(tmp_path, "policy"), _checkpoint(tmp_path, "teacher")
    identity = stage_identity(
        "toy", 1, {}, {"policy": policy.fingerprint, "teacher": teacher.fingerprint}
    )
    ctx = RunContext(root=str(tmp_path / "runs"), run="r")
    outcome = run_stage_on_artifacts(ctx, identity, {"policy": policy, "teacher": teacher}, _work)
    record = storage.read_json(outcome.record_uri)
    assert {n: ref["uri"] for n, ref in record["input_artifacts"].items()} == {
        "policy": policy.uri,
        "teacher": teacher.uri,
    }
    assert record["inputs"] == identity.inputs
    again = run_stage_on_artifacts(ctx, identity, {"policy": policy, "teacher": teacher}, _work)
    assert again.skipped and again.record_uri == outcome.record_uri


@pytest.mark.parametrize("wrong", ["name", "fingerprint"])
def test_run_on_refuses_an_input_its_identity_does_not_hash(tmp_path: Path, wrong: str) -> None:
    policy, other = _checkpoint(tmp_path, "policy"), _checkpoint(tmp_path, "other")
    hashed = {"sft" if wrong == "name" else "policy": other.fingerprint}
    ctx = RunContext(root=str(tmp_path / "runs"), run="r")
    with pytest.raises(ValueError, match=r"input 'policy'.*identity hashes"):
        run_stage_on_artifacts(ctx, stage_identity("toy", 1, {}, hashed), {"policy": policy}, _work)
    assert not (tmp_path / "runs").exists()  # refused before any directory or work


def _calls(module: str) -> set[str]:
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    return {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }


def test_every_shipped_stage_with_inputs_runs_through_the_one_wrapper() -> None:
    """No shipped kind builds its StageIdentity, attaches URIs or calls run_stage by hand
    (data_prep, which has no upstream input, hashes its sources and calls run_stage)."""
    for spec in registry.BUILTIN:
        if not spec.ports and spec.any_other_input is None:
            continue
        calls = _calls(spec.module)
        assert "run_stage_on_artifacts" in calls and "stage_identity" in calls, spec.kind
        assert not calls & {"run_stage", "with_uris", "StageIdentity"}, spec.kind
