"""Resuming runs for real: drift refused with a diff, allowed continuation, status, lineage and
audit, a transient failure retried by Prefect, a permanent one fixed and resumed, and one run
spread over several short sessions ending bitwise equal to a single session.

Everything runs the real flow on the tiny model against a real Prefect API (test harness).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import yaml
from flax import nnx

from flows import cli
from flows.far_flow import format_align_reinforce
from pipeline import lineage, manifest
from schemas.artifacts import CheckpointArtifact
from schemas.recipe import MeshSpec, Recipe
from schemas.record import StageRecord
from stages import sft
from stages.core import drift, storage
from stages.core.decisions import stage_directory
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.grpo import training as grpo
from stages.modeling import models
from tests.conftest import recipe_with
from tests.integration._sft_child import paced_stream

pytestmark = pytest.mark.slow

SMALL = {
    "sft": {"max_steps": 20, "checkpoint_every_steps": 10},
    "grpo": {"max_steps": 2, "checkpoint_every_steps": 1},
    "eval": {"models": ["sft", "grpo"], "max_generation_tokens": 16},
}


def small_recipe(root: str, **changes: Any) -> Recipe:
    sections = {k: {**SMALL.get(k, {}), **v} for k, v in changes.items()}
    # eval's 16 tokens hold a few of the smoke targets: accepted, as `far run` would refuse them
    return recipe_with(root, allow_long_sft_targets=True, **{**SMALL, **sections})  # type: ignore[arg-type]


def run_flow(recipe: Recipe, **kwargs: Any) -> Any:
    return format_align_reinforce(recipe, storage.normalize(recipe.storage_root), **kwargs)


def record(uri: str) -> StageRecord:
    return lineage.find_record(uri)[1]


@pytest.fixture(scope="module")
def finished(prefect_server: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    root = str(tmp_path_factory.mktemp("resume"))
    summary = run_flow(small_recipe(root))
    assert summary.complete
    return root, summary


def test_changed_recipe_is_refused_with_a_readable_diff(
    finished: tuple[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = finished
    data = small_recipe(root, sft={"learning_rate": 1e-4}).model_dump(mode="json")
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(data))
    assert cli.main(["run", str(path)]) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    assert "sft.learning_rate: 0.003 -> 0.0001" in err
    assert "--allow-change sft.learning_rate" in err and "--name NEW" in err
    # nothing was started for the refused recipe
    assert len(list(Path(root, "smoke").glob("sft-*"))) == 1


def test_changed_stage_code_is_refused_naming_the_stage_version(
    finished: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = finished
    now = grpo.STAGE_VERSION
    monkeypatch.setattr(grpo, "STAGE_VERSION", now + 1)  # a commit that bumps it
    with pytest.raises(drift.DriftError, match=rf"code\.grpo_version: {now} -> {now + 1}"):
        run_flow(small_recipe(root))


def test_changed_source_data_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text(arithmetic_rows(40))
    spec = {"kind": "file", "name": str(source), "adapter": "gsm8k"}
    data = {
        "eval": {"size": 4, "sources": [spec]},
        "grpo": {"size": 4, "sources": [spec]},
        "sft": {"size": 16, "sources": [spec]},
    }
    recipe = recipe_with(str(tmp_path), data=data)
    ctx = RunContext(str(tmp_path), "data")
    first = data_prep.prepare(recipe.data, recipe.model, ctx)
    assert data_prep.prepare(recipe.data, recipe.model, ctx).skipped  # unchanged: reused
    source.write_text(arithmetic_rows(40, offset=1))  # same config, other content
    with pytest.raises(drift.DriftError, match=r"data\.source_content\.file:.*sha256:"):
        data_prep.prepare(recipe.data, recipe.model, ctx)
    allowed = RunContext(str(tmp_path), "data", allow_changes=("data.source_content",))
    second = data_prep.prepare(recipe.data, recipe.model, allowed)
    assert second.output.fingerprint != first.output.fingerprint


def test_raising_max_steps_continues_sft_from_its_checkpoint_then_status_lineage_audit(
    finished: tuple[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = finished
    more = small_recipe(root, sft={"max_steps": 30})
    summary = run_flow(more, allow_changes=["sft.max_steps"])
    assert summary.complete
    sft_line = next(s for s in summary.stages if s.stage == "sft")
    continued = record(sft_line.output_uri)
    assert continued.metrics["resumed_from_step"] == 20  # not from scratch
    # the superseded directory's curves stay in its own record: this history says where
    # it begins
    assert continued.metrics["history_from_step"] == 20 and len(continued.history["loss"]) == 10
    run_uri = storage.join(root, "smoke")
    states = {(s.stage, s.state) for s in manifest.run_status(run_uri)}
    assert ("sft", "superseded") in states and ("sft", "complete") in states
    assert cli.main(["status", run_uri]) == 0
    shown = capsys.readouterr().out
    assert "step 30/30" in shown and "superseded" in shown
    run_manifest = manifest.read_manifest(run_uri)
    assert "sft.max_steps: 20 -> 30" in run_manifest.invocations[-1].changes
    check_lineage(summary, run_uri, tmp_path, capsys)
    check_audit(run_uri, summary, capsys)


def check_lineage(
    summary: Any, run_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = next(s for s in summary.stages if s.stage == "evaluate").output_uri
    events_file = tmp_path / "events.jsonl"
    assert cli.main(["lineage", report, "--openlineage", str(events_file)]) == 0
    tree = capsys.readouterr().out
    for stage in ("evaluate", "grpo", "sft", "data_prep"):
        assert f": {stage} -> " in tree
    assert "source reasoning_gym:basic_arithmetic (reasoning-gym==" in tree
    assert "reused (skipped) in" in tree  # data_prep was skipped by the continuing session
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    for event in events:
        assert {"eventType", "eventTime", "run", "job", "producer", "schemaURL"} <= set(event)
        uuid.UUID(event["run"]["runId"])
    completes = [e for e in events if e["eventType"] == "COMPLETE"]
    assert {e["job"]["name"] for e in completes} == {"data_prep", "sft", "grpo", "evaluate"}
    config = lambda e: e["run"]["facets"]["far_stage"]["config"]  # noqa: E731
    sft_event = next(
        e for e in completes if e["job"]["name"] == "sft" and config(e)["sft"]["max_steps"] == 30
    )
    assert sft_event["outputs"][0]["name"].endswith("checkpoints")
    assert sft_event["inputs"][0]["namespace"] == "file"


def check_audit(run_uri: str, summary: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["audit", run_uri]) == 0
    assert "everything matches" in capsys.readouterr().out
    ckpt = next(s for s in summary.stages if s.stage == "sft").output_uri
    victim = sorted(p for p in Path(ckpt).rglob("*") if p.is_file())[0]
    original = victim.read_bytes()
    victim.write_bytes(original + b"!")
    extra = Path(ckpt).parent / "planted.txt"
    extra.write_text("x")
    try:
        assert cli.main(["audit", run_uri]) == cli.EXIT_PROBLEMS
        out = capsys.readouterr().out
        assert f"{victim.name}: altered" in out and "planted.txt: not in the record" in out
        victim.unlink()
        assert cli.main(["audit", run_uri]) == cli.EXIT_PROBLEMS
        assert f"{victim.name}: missing" in capsys.readouterr().out
    finally:
        victim.write_bytes(original)
        extra.unlink()


def arithmetic_rows(n: int, offset: int = 0) -> str:
    rows = [
        {
            "question": f"What is {i} + {i + offset + 1}?",
            "answer": f"{i} + {i + offset + 1} = {2 * i + offset + 1}\n#### {2 * i + offset + 1}",
        }
        for i in range(n)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


class FlakyFiles(http.server.ThreadingHTTPServer):
    """Serves files from memory; the next `failures` requests get 503 (an overloaded store)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.failures, self.served_503 = files, 0, 0
        super().__init__(("127.0.0.1", 0), _FlakyHandler)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}"


class _FlakyHandler(http.server.BaseHTTPRequestHandler):
    server: FlakyFiles

    def _answer(self, body: bool) -> None:
        if self.server.failures > 0:
            self.server.failures -= 1
            self.server.served_503 += 1
            self.send_response(503)
            self.end_headers()
            return
        data = self.server.files.get(self.path.lstrip("/"))
        self.send_response(200 if data is not None else 404)
        self.send_header("Content-Length", str(len(data or b"")))
        self.end_headers()
        if body and data:
            self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def flaky_files() -> Iterator[FlakyFiles]:
    server = FlakyFiles({"rows.jsonl": arithmetic_rows(40).encode()})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_transient_error_retried_permanent_error_kept_then_resumed_after_the_fix(
    prefect_server: None, flaky_files: FlakyFiles, tmp_path: Path
) -> None:
    spec = {"kind": "file", "name": flaky_files.url("rows.jsonl"), "adapter": "gsm8k"}
    data = {
        "eval": {"size": 4, "sources": [spec]},
        "grpo": {"size": 4, "sources": [spec]},
        "sft": {"size": 16, "sources": [spec]},
    }
    teacher = recipe_with(str(tmp_path), name="teacher", data=data, sft=SMALL["sft"])
    teacher_ctx = RunContext(str(tmp_path), "teacher")
    dataset = data_prep.prepare(teacher.data, teacher.model, teacher_ctx).output
    teacher_sft = stage_directory(
        teacher_ctx, "sft", sft.identity(teacher.sft, teacher.model, dataset.fingerprint).digest
    )
    missing = storage.join(teacher_sft, "checkpoints")  # not trained yet: a permanent error
    recipe = small_recipe(str(tmp_path), data=data, eval={"models": ["sft", missing]})
    flaky_files.failures = 2  # HEAD and GET of the first attempt's first read
    state = run_flow(recipe, return_state=True)
    assert state.is_failed()
    assert flaky_files.served_503 == 2
    with pytest.raises(FileNotFoundError, match="no committed FAR checkpoint"):
        state.result()
    task_runs = task_runs_of(state.state_details.flow_run_id)
    assert task_runs["data_prep"].run_count == 2  # 503 -> retried by Prefect -> completed
    assert task_runs["data_prep"].state.is_completed()
    assert task_runs["evaluate"].run_count == 1  # permanent: not retried
    assert task_runs["evaluate"].state.is_failed()
    done = {s.stage: s.state for s in manifest.run_status(storage.join(str(tmp_path), "smoke"))}
    assert done == {
        "data_prep": "complete",
        "sft": "complete",
        "grpo": "complete",
        "evaluate": "not started",
    }
    sft.train(dataset, teacher.sft, teacher.model, teacher.mesh, teacher_ctx)  # the fix
    summary = run_flow(recipe)
    assert summary.complete
    assert [s.stage for s in summary.stages if s.skipped] == ["data_prep", "sft", "grpo"]


def task_runs_of(flow_run_id: Any) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        found = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {run.name.rsplit("-", 1)[0]: run for run in found}  # task runs are named "{task}-xyz"


# A short session's SFT batches are paced (a sleep before each, tests/integration/_sft_child.py)
# so that it takes at most SESSION_STEPS steps whatever its budget: the two short sessions
# together cannot finish SESSION_SFT_STEPS, on an idle machine with a warm compile cache or a
# loaded one that doubled the budget, and the steps cost little CPU (the last session, unpaced,
# trains the rest)
SESSION_STEPS = 25
SESSION_SFT_STEPS = 60


def test_short_sessions_reach_the_same_result_as_one(prefect_server: None, tmp_path: Path) -> None:
    changes = {
        # No periodic saves: a stopped session saves its last step (Tunix's forced final save),
        # which is what the next one resumes from
        "sft": {
            "max_steps": SESSION_SFT_STEPS,
            "checkpoint_every_steps": SESSION_SFT_STEPS,
            "save_margin_seconds": 0.5,
        },
        "eval": {"models": ["sft"]},
    }
    one = run_flow(small_recipe(str(tmp_path / "one"), **changes))
    assert one.complete
    recipe = small_recipe(str(tmp_path / "many"), **changes)
    run_uri = storage.join(str(tmp_path / "many"), "smoke")
    sessions, summary, budget = 0, None, 8.0
    while summary is None or not summary.complete:
        sessions += 1
        assert sessions <= 12, f"no progress across sessions; last budget {budget} s"
        # short sessions until SFT has been stopped twice, then one session to the end; a
        # session too short to reach SFT's first step (a loaded machine) doubles the budget
        stopped = stopped_sft_sessions(run_uri)
        with pytest.MonkeyPatch.context() as patch:
            if stopped < 2:  # paced: a short session trains at most budget / pace steps
                patch.setattr(sft, "in_memory_stream", paced_stream(budget / SESSION_STEPS))
            summary = run_flow(recipe, deadline=time.time() + (budget if stopped < 2 else 900))
        if stopped_sft_sessions(run_uri) == stopped:
            budget *= 2
    sft_record = record(next(s.output_uri for s in summary.stages if s.stage == "sft"))
    # paced, the two short sessions cannot finish SFT together: each stops, the last completes
    outcomes = [s.outcome for s in sft_record.sessions]
    assert len(outcomes) >= 2 and set(outcomes[:-1]) == {"stopped"} and outcomes[-1] == "complete"
    assert sft_record.metrics["resumed_from_step"] > 0
    # every session's curves, equal to one session's step by step (the losses of equal
    # weights on the same batches)
    one_sft = record(next(s.output_uri for s in one.stages if s.stage == "sft"))
    assert sft_record.history == one_sft.history and sft_record.metrics["history_from_step"] == 0
    assert sessions >= 2 and len(manifest.read_manifest(run_uri).invocations) == sessions
    for stage in ("sft", "grpo"):
        expected = next(s.output_uri for s in one.stages if s.stage == stage)
        got = next(s.output_uri for s in summary.stages if s.stage == stage)
        assert_same_params(record(expected).output, record(got).output)  # type: ignore[arg-type]


def stopped_sft_sessions(run_uri: str) -> int:
    states = (
        [s for s in manifest.run_status(run_uri) if s.stage == "sft"]
        if storage.exists(manifest.manifest_uri(run_uri))
        else []
    )
    return states[-1].sessions if states else 0


def assert_same_params(a: CheckpointArtifact, b: CheckpointArtifact) -> None:
    mesh = models.build_mesh(MeshSpec())
    leaves = []
    for artifact in (a, b):
        base = models.build_base_model(artifact.model, mesh, "unused")
        policy = models.restore_policy(artifact, base, mesh)
        leaves.append([np.asarray(x) for x in jax.tree.leaves(nnx.state(policy, nnx.LoRAParam))])
    assert all(np.array_equal(x, y) for x, y in zip(*leaves, strict=True))
