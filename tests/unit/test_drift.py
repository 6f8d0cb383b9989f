"""The drift guard's diff and allow rules, the run manifest, and transient-error classification."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from pipeline import manifest
from stages.core import drift, storage
from stages.core.runner import RunContext
from tests.conftest import recipe_with

DIFFS: list[tuple[Any, Any, list[str]]] = [
    ({"a": 1}, {"a": 1}, []),
    ({"a": 1}, {"a": 2}, ["a: 1 -> 2"]),
    ({"s": {"x": 1, "y": 2}}, {"s": {"x": 1, "y": 3}}, ["s.y: 2 -> 3"]),
    ({"s": {"x": 1}}, {"s": {"x": 1, "z": "n"}}, ['s.z: (absent) -> "n"']),
    ({"s": {"x": 1}}, {"s": {}}, ["s.x: 1 -> (absent)"]),
    ({"l": [1, 2]}, {"l": [1, 3]}, ["l: [1, 2] -> [1, 3]"]),  # lists compare whole
    ({"a": None}, {"a": {"b": 1}}, ['a: null -> {"b": 1}']),
    # pipeline nodes are compared by id: one changed setting, not the whole pipeline
    (
        {"p": [{"id": "a", "c": {"k": 1}}, {"id": "b"}]},
        {"p": [{"id": "a", "c": {"k": 4}}, {"id": "b"}, {"id": "z"}]},
        ["p.a.c.k: 1 -> 4", 'p.z: (absent) -> {"id": "z"}'],
    ),
    (
        {"l": [{"id": "a"}, {"id": "a"}]},
        {"l": [{"id": "a"}]},
        ['l: [{"id": "a"}, {"id": "a"}] -> [{"id": "a"}]'],
    ),
]


@pytest.mark.parametrize(("old", "new", "expected"), DIFFS)
def test_diff_names_every_changed_leaf(old: Any, new: Any, expected: list[str]) -> None:
    assert [str(c) for c in drift.diff(old, new)] == expected


ALLOWS: list[tuple[str, tuple[str, ...], bool]] = [
    ("sft.max_steps", ("sft.max_steps",), True),
    ("sft.max_steps", ("sft",), True),
    ("sft.max_steps", ("sft.max",), False),  # a prefix is a whole path segment
    ("sft.lora.rank", ("sft.lora",), True),
    ("grpo.beta", ("sft",), False),
    ("grpo.beta", (), False),
]


@pytest.mark.parametrize(("path", "allowed", "ok"), ALLOWS)
def test_allowed_paths_and_prefixes(path: str, allowed: tuple[str, ...], ok: bool) -> None:
    assert drift.is_allowed(drift.Change(path, 1, 2), allowed) is ok


def test_refusal_lists_every_change_and_the_flags_that_allow_the_refused_ones() -> None:
    changes = [drift.Change("sft.max_steps", 10, 20), drift.Change("grpo.beta", 0.04, 0.0)]
    with pytest.raises(drift.DriftError) as caught:
        drift.check("the recipe", changes, ["sft.max_steps"])
    message = str(caught.value)
    assert "sft.max_steps: 10 -> 20" in message and "grpo.beta: 0.04 -> 0.0" in message
    assert "--allow-change grpo.beta" in message
    assert "--allow-change sft.max_steps" not in message  # already allowed
    assert drift.check("the recipe", changes, ["sft", "grpo"]) == changes


def test_where_and_how_long_a_run_happens_is_not_drift() -> None:
    base = recipe_with("/tmp/a").model_dump(mode="json")
    moved = {
        **base,
        "storage_root": "gs://b/x",
        "name": "other",
        "session_budget": None,
        "mesh": {"fsdp": 2, "tp": 1},
        "sandbox": {"isolation": "process", "workers": 1},
        "logging": {"tensorboard": False, "mlflow": True, "wandb": True, "experiment": "x"},
    }
    assert drift.recipe_changes(base, moved) == []
    older = {k: v for k, v in base.items() if k not in ("sandbox", "logging")}  # from before
    assert drift.recipe_changes(older, base) == []
    changed = recipe_with("/tmp/a", sft={"learning_rate": 1e-4}).model_dump(mode="json")
    assert [c.path for c in drift.recipe_changes(base, changed)] == ["sft.learning_rate"]


@pytest.mark.parametrize(
    ("paths", "ok"),
    [
        (["sft.max_steps"], True),
        (["grpo.max_steps", "sft.checkpoint_every_steps"], True),
        (["sft.max_steps", "sft.learning_rate"], False),
        ([], False),
    ],
)
def test_only_continuation_settings_carry_checkpoints_over(paths: list[str], ok: bool) -> None:
    assert drift.continuable([drift.Change(p, 1, 2) for p in paths]) is ok


@pytest.mark.parametrize(
    ("allowed", "expected"),
    [
        (("pipeline",), ("eval",)),
        (("pipeline.headroom",), ("eval",)),
        (("pipeline.headroom.config",), ("eval",)),
        (("pipeline.headroom.config.samples",), ("eval.samples",)),
        (("pipeline.evaluate",), ()),  # another node
        (("eval.seed",), ()),  # a recipe section is named as it is
    ],
)
def test_allowing_a_pipeline_node_allows_its_stage_config(
    allowed: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    """`--allow-change pipeline.headroom` also lets the headroom node's stage start with its
    changed config, which its identity names `eval.*` (it was refused there, after the
    recipe-level check had allowed it)."""
    assert drift.node_allowances(allowed, "headroom", ["eval"]) == allowed + expected
    change = drift.Change("eval.samples", 1, 4)
    allowances = drift.node_allowances(allowed, "headroom", ["eval"])
    assert drift.is_allowed(change, allowances) == bool(expected)


def test_manifest_records_sessions_and_refuses_a_changed_recipe() -> None:
    root = f"memory://far-drift-{uuid.uuid4().hex[:8]}"
    recipe = recipe_with(root)
    ctx = RunContext(root=root, run=recipe.name, flow_run_id="one")
    assert manifest.open_session(recipe, ctx, "recipes/smoke.yaml") == []
    manifest.close_session(ctx.run_uri, "one", {"sft": "ran"}, "stopped: deadline")
    same = manifest.open_session(recipe, RunContext(root=root, run=recipe.name), "again")
    assert same == []
    changed = recipe_with(root, sft={"max_steps": 300})
    with pytest.raises(drift.DriftError, match=r"sft\.max_steps: 150 -> 300"):
        manifest.open_session(changed, ctx, "edited.yaml")
    allowed = RunContext(root=root, run=recipe.name, allow_changes=("sft.max_steps",))
    assert [c.path for c in manifest.open_session(changed, allowed, "edited.yaml")] == [
        "sft.max_steps"
    ]
    run_manifest = manifest.read_manifest(ctx.run_uri)
    assert run_manifest.recipe["sft"]["max_steps"] == 300  # the run now follows the allowed recipe
    assert [i.outcome for i in run_manifest.invocations] == ["stopped: deadline", None, None]
    assert run_manifest.invocations[-1].changes == ["sft.max_steps: 150 -> 300"]


def test_a_field_added_with_a_default_since_the_run_started_is_not_drift() -> None:
    root = f"memory://far-drift-{uuid.uuid4().hex[:8]}"
    recipe = recipe_with(root)
    ctx = RunContext(root=root, run=recipe.name, flow_run_id="one")
    manifest.open_session(recipe, ctx, "recipes/smoke.yaml")
    run_manifest = manifest.read_manifest(ctx.run_uri)
    older = dict(run_manifest.recipe)
    older["eval"] = {k: v for k, v in older["eval"].items() if k != "split"}  # before it existed
    storage.write_json(
        manifest.manifest_uri(ctx.run_uri),
        run_manifest.model_copy(update={"recipe": older}).model_dump(mode="json"),
    )
    assert manifest.open_session(recipe, ctx, "recipes/smoke.yaml") == []
    changed = recipe_with(root, eval={"split": "grpo_train"})
    with pytest.raises(drift.DriftError, match=r'eval\.split: "eval" -> "grpo_train"'):
        manifest.open_session(changed, ctx, "edited.yaml")


def test_status_of_a_path_that_is_not_a_run_says_what_it_expected() -> None:
    with pytest.raises(FileNotFoundError, match=r"no FAR run at memory://nowhere.*run\.json"):
        manifest.run_status("memory://nowhere")


def test_latest_checkpoint_step_ignores_uncommitted_orbax_tmp_dirs() -> None:
    stage = f"memory://far-ckpt-{uuid.uuid4().hex[:8]}/sft-x"
    for name in ("5", "10", "15.orbax-checkpoint-tmp-1234"):
        storage.write_text(storage.join(stage, "checkpoints", name, "f"), "x")
    assert manifest.latest_checkpoint_step(stage) == 10
    storage.write_text(storage.join(stage, "checkpoints", "actor", "3", "f"), "x")
    assert manifest.latest_checkpoint_step(stage) == 3  # GRPO's actor checkpoints come first


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as e:
        return e


def _http_error(code: int) -> BaseException:
    from gcsfs.retry import HttpError

    return HttpError({"code": code, "message": f"status {code}"})


def _aiohttp_error(name: str) -> BaseException:
    import aiohttp

    if name == "disconnected":
        return aiohttp.ServerDisconnectedError()
    info = aiohttp.RequestInfo(url=__import__("yarl").URL("http://x"), method="GET", headers={})  # type: ignore[arg-type]
    return aiohttp.ClientResponseError(info, (), status=503 if name == "503" else 404)


TRANSIENT: list[tuple[str, Any, bool]] = [
    ("timeout", lambda: TimeoutError("read timed out"), True),
    ("connection reset", lambda: ConnectionResetError(104, "reset"), True),
    ("refused", lambda: ConnectionRefusedError(111, "refused"), True),
    ("hub offline (plain ConnectionError)", lambda: ConnectionError("hub unreachable"), False),
    ("missing file", lambda: FileNotFoundError("gs://b/x"), False),
    ("bad value", lambda: ValueError("bad recipe"), False),
    ("wrapped timeout", lambda: _chained(ValueError("load failed"), TimeoutError()), True),
    ("wrapped missing file", lambda: _chained(RuntimeError("x"), FileNotFoundError()), False),
    ("gcs 503", lambda: _http_error(503), True),
    ("gcs 429", lambda: _http_error(429), True),
    ("gcs 404", lambda: _http_error(404), False),
    ("gcs 403", lambda: _http_error(403), False),
    ("aiohttp disconnect", lambda: _aiohttp_error("disconnected"), True),
    ("http 503", lambda: _aiohttp_error("503"), True),
    ("http 404", lambda: _aiohttp_error("404"), False),
]


@pytest.mark.parametrize(("case", "make", "expected"), TRANSIENT, ids=[t[0] for t in TRANSIENT])
def test_transient_errors_are_told_from_permanent_ones(
    case: str, make: Any, expected: bool
) -> None:
    assert storage.is_transient(make()) is expected


@pytest.mark.parametrize(("error", "retried"), [(TimeoutError(), True), (ValueError(), False)])
def test_prefect_retry_condition_reads_the_exception_from_the_failed_state(
    error: BaseException, retried: bool
) -> None:
    from prefect.states import Failed

    from flows.far_flow import retry_if_transient

    assert retry_if_transient(None, None, Failed(data=error)) is retried  # type: ignore[arg-type]


def test_a_stage_starts_with_a_changed_node_config_the_user_allowed(tmp_path: Any) -> None:
    """The stage-level guard reads `--allow-change pipeline.<node>` too: a node whose own
    config changed was allowed by the recipe check, then refused when its stage started."""
    from schemas.artifacts import CheckpointArtifact
    from stages.core.runner import StageIdentity, run_stage
    from tests.unit.test_records import checkpoint_stage

    root = str(tmp_path)

    def stage(ctx: RunContext, samples: int) -> Any:
        done = checkpoint_stage(RunContext(root=root, run="r", node="donor"), "x", {}, {})
        identity = StageIdentity("evaluate", 1, {"eval": {"samples": samples}}, {})

        def work(directory: str) -> tuple[CheckpointArtifact, dict[str, float], dict[str, Any]]:
            return done.output, {}, {}

        return run_stage(ctx, identity, work)

    stage(RunContext(root=root, run="r", node="headroom"), 1)
    with pytest.raises(drift.DriftError, match=r"eval\.samples: 1 -> 4"):
        stage(RunContext(root=root, run="r", node="headroom"), 4)
    allowed = RunContext(root=root, run="r", node="headroom", allow_changes=("pipeline.headroom",))
    assert stage(allowed, 4).output.uri
