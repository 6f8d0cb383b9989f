"""recipes/smoke-dag.yaml for real: a longer pipeline on the tiny model through the flow.

One run (the session's `dag_run` fixture, on the real Prefect server) feeds every assertion:
the nodes ran in DAG order with their own directories, hard_subset kept the training prompts
the GRPO policy failed (none of them in the eval split the last evaluation scores), self_teach
rows name their checkpoint, sample and rewards and a following sft continued from sft on them,
DPO and ORPO trained from preference pairs built from the evaluation, pick chose between sft
and grpo on the validation split, the last evaluation compared seven models (the chosen one
among them), and status, lineage, audit and a re-run (everything skipped) follow the DAG.
Then each new stage (and distill) is stopped mid-way in a second root and resumed, ending
where the flow's run did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from flows.far_flow import format_align_reinforce
from pipeline import lineage, manifest
from pipeline.dag import build_dag, node_config
from schemas.artifacts import CheckpointArtifact
from schemas.recipe import LoraSpec, MeshSpec, Recipe
from schemas.record import RunSummary, StageRecord
from stages import distill, dpo, hard_subset, preferences, self_teach, sft
from stages.core import storage
from stages.core.datasets import load_prompts
from stages.core.errors import InputError
from stages.core.records import record_directory
from stages.core.runner import RunContext, SessionExpired
from stages.core.sessions import StopFlag
from stages.modeling import models
from tests.conftest import on_api

pytestmark = pytest.mark.slow


class StopAfter(StopFlag):
    """A stop request that arrives after `checks` looks at the flag (deterministic)."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.left = checks

    def is_set(self) -> bool:
        self.left -= 1
        if self.left < 0 and not super().is_set():
            self.request("stop requested by the test")
        return super().is_set()


def records(summary: RunSummary) -> dict[str, StageRecord]:
    return {
        s.stage: StageRecord.model_validate(storage.read_json(s.record_uri)) for s in summary.stages
    }


def saved_steps(artifact: Any) -> list[int]:
    """The steps saved under a checkpoint artifact's directory; the last is the committed."""
    found = sorted(int(p.name) for p in Path(artifact.uri).iterdir() if p.name.isdigit())
    assert found[-1] == artifact.step
    return found


def rows(uri: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in storage.read_text(uri).splitlines() if line]


def test_every_node_ran_in_dag_order_in_its_own_directory(
    dag_run: tuple[Recipe, RunSummary],
) -> None:
    recipe, summary = dag_run
    assert summary.complete, summary.stopped_reason
    assert [s.stage for s in summary.stages] == list(build_dag(recipe).ids)
    for node_id, record in records(summary).items():
        assert Path(record.directory).name.startswith(f"{node_id}-")
        assert record.node == (None if node_id == record.stage else node_id)


def test_prefect_task_graph_has_the_dag_edges(
    dag_run: tuple[Recipe, RunSummary], prefect_api: str
) -> None:
    """Each task waits on its upstream tasks' states, which is what the UI's run graph draws
    (tests/e2e/test_prefect_ui.py screenshots it)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    recipe, summary = dag_run
    flow_run_id = records(summary)["data_prep"].flow_run_id
    assert flow_run_id is not None
    with on_api(prefect_api), get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    name = {run.id: run.name.rsplit("-", 1)[0] for run in runs}
    drawn = {
        (name[parent.id], name[run.id])
        for run in runs
        for parent in run.task_inputs.get("wait_for", [])
    }
    assert drawn == {(source, target) for source, target, _ in build_dag(recipe).edges()}


def test_hard_subset_keeps_the_training_prompts_grpo_still_fails(
    dag_run: tuple[Recipe, RunSummary],
) -> None:
    _, summary = dag_run
    found = records(summary)
    report = found["evaluate_train"].output
    failed = {
        r["id"] for r in rows(report.samples_uri) if r["model"] == "grpo" and not r["correct"]
    }  # type: ignore[union-attr]
    hard = found["hard"].output
    kept = {r["id"] for r in rows(storage.join(hard.uri, "grpo_prompts.jsonl"))}
    assert kept == failed or (len(failed) < 2 and failed <= kept and len(kept) == 2)
    assert found["grpo_hard"].inputs["dataset"] == hard.fingerprint
    assert found["grpo_hard"].inputs["sft"] == found["grpo"].output.fingerprint


def test_hard_prompts_are_training_prompts_and_the_eval_split_stays_held_out(
    dag_run: tuple[Recipe, RunSummary],
) -> None:
    """The hard dataset's prompts share no example id with the eval split that evaluate_all
    scores after grpo_hard trained on them."""
    _, summary = dag_run
    found = records(summary)
    data = found["data_prep"].output
    training = {r["id"] for r in load_prompts(data, "grpo_train")}  # type: ignore[arg-type]
    held_out = {r["id"] for r in load_prompts(data, "eval")}  # type: ignore[arg-type]
    hard = found["hard"].output
    kept = {r["id"] for r in load_prompts(hard, "grpo_train")}  # type: ignore[arg-type]
    assert kept and kept <= training and not kept & held_out
    assert {r["id"] for r in load_prompts(hard, "eval")} == held_out  # type: ignore[arg-type]
    scored = {r["id"] for r in rows(found["evaluate_train"].output.samples_uri)}  # type: ignore[union-attr]
    assert scored == training
    final = {r["id"] for r in rows(found["evaluate_all"].output.samples_uri)}  # type: ignore[union-attr]
    assert final == held_out


def test_self_teach_rows_name_their_origin_and_train_the_next_sft(
    dag_run: tuple[Recipe, RunSummary],
) -> None:
    _, summary = dag_run
    found = records(summary)
    taught = found["self_teach"].output
    provenance = rows(storage.join(taught.uri, self_teach.ROWS_FILE))
    assert provenance, "no verified completion was kept"
    for row in provenance:
        assert row["checkpoint"] == found["sft"].output.uri
        assert row["rewards"] == {"format_strict": 1.0} and row["verified"]
        assert set(row) >= {"prompt_id", "prompt", "sample", "completion"}
    assert taught.split_sizes["sft_train"] == len(provenance)  # type: ignore[union-attr]
    assert found["sft_self"].inputs["dataset"] == taught.fingerprint
    assert found["sft_self"].output.step == 4  # type: ignore[union-attr]


def test_sft_continues_from_its_policy_checkpoint(
    dag_run: tuple[Recipe, RunSummary], tmp_path: Path
) -> None:
    """sft_self starts from sft's trained adapters: after its 4 steps they are within Adam's
    step bound of sft's (4 x lr x (1 - b1) / sqrt(1 - b2)), which fresh adapters are not, and
    its first loss is below that of fresh adapters (sft's first). A LoRA that differs is
    refused before compute."""
    recipe, summary = dag_run
    found = records(summary)
    assert found["sft_self"].inputs["policy"] == found["sft"].output.fingerprint
    config = node_config(recipe, build_dag(recipe).node("sft_self"))
    mesh = models.build_mesh(MeshSpec())
    start, continued = (lora_leaves(found[n].output, mesh) for n in ("sft", "sft_self"))  # type: ignore[arg-type]
    fresh = models.apply_lora(
        models.build_base_model(recipe.model, mesh, "unused"), config.lora, mesh, config.seed
    )
    fresh_leaves = [np.asarray(x) for x in jax.tree.leaves(nnx.state(fresh, nnx.LoRAParam))]
    bound = config.max_steps * config.learning_rate * 0.1 / np.sqrt(0.001)
    assert max_abs_difference(continued, start) <= bound
    assert max_abs_difference(fresh_leaves, start) > 3 * bound
    first_losses = found["sft"].metrics["first_loss"], found["sft_self"].metrics["first_loss"]
    assert first_losses[1] < first_losses[0] - 1.0, first_losses
    other_lora = config.model_copy(update={"lora": LoraSpec(rank=4, alpha=8.0)})
    with pytest.raises(InputError, match="whose LoRA is"):
        sft.train(
            found["self_teach"].output,  # type: ignore[arg-type]
            other_lora,
            recipe.model,
            recipe.mesh,
            RunContext(root=str(tmp_path), run="refused"),
            policy=found["sft"].output,  # type: ignore[arg-type]
        )


def test_dpo_and_orpo_train_on_pairs_from_the_evaluation(
    dag_run: tuple[Recipe, RunSummary],
) -> None:
    _, summary = dag_run
    found = records(summary)
    pairs = rows(found["pairs"].output.uri)
    assert pairs and all(p["chosen_reward"] > p["rejected_reward"] for p in pairs)
    for node_id, steps in (("dpo", 3), ("orpo", 2)):
        record = found[node_id]
        assert record.stage == "dpo" and record.output.step == steps  # type: ignore[union-attr]
        assert len(record.history["loss"]) == steps
        assert all(np.isfinite(record.history["loss"]))
    assert found["dpo"].config["dpo"]["algorithm"] == "dpo"
    assert found["orpo"].config["dpo"]["algorithm"] == "orpo"


def test_a_smaller_student_learns_from_the_sft_teacher(
    dag_run: tuple[Recipe, RunSummary],
) -> None:
    _, summary = dag_run
    found = records(summary)
    student = found["distill"].output
    assert isinstance(student, CheckpointArtifact) and student.step == 4
    assert student.model.architecture is not None and student.model.architecture.num_layers == 1
    assert found["distill"].inputs["teacher"] == found["sft"].output.fingerprint
    assert np.isfinite(found["distill"].history["loss"]).all()
    assert found["distill"].metrics["student_params_bytes"] < models.param_bytes(
        models.build_base_model(found["sft"].output.model, models.build_mesh(MeshSpec()), "x")  # type: ignore[union-attr]
    )
    mesh = models.build_mesh(MeshSpec())
    restored = models.restore_policy(
        student, models.build_base_model(student.model, mesh, "x"), mesh
    )
    assert restored is not None


def test_the_last_evaluation_compares_checkpoints_from_every_branch(
    dag_run: tuple[Recipe, RunSummary],
) -> None:
    _, summary = dag_run
    report = records(summary)["evaluate_all"].output
    names = [s.name for s in report.scores]  # type: ignore[union-attr]
    assert names == [
        "base",
        "base-3shot",
        "chosen",
        "dpo",
        "grpo",
        "grpo_hard",
        "orpo",
        "sft_self",
    ]
    assert [s.name for s in records(summary)["evaluate_train"].output.scores] == ["grpo"]  # type: ignore[union-attr]


def test_pick_outputs_the_policy_with_the_better_validation_accuracy(
    dag_run: tuple[Recipe, RunSummary],
) -> None:
    """pick read evaluate_val's greedy rows of the validation split (no eval-split prompt):
    sft, and grpo at each step it saved (`steps: saved`, grpo keeping every checkpoint), then
    output the best of them (sft on a tie) at its step, and evaluate_all scored that very
    checkpoint as `chosen` after the choice."""
    _, summary = dag_run
    found = records(summary)
    val_rows = rows(found["evaluate_val"].output.samples_uri)  # type: ignore[union-attr]
    held_out = {r["id"] for r in rows(found["evaluate_all"].output.samples_uri)}  # type: ignore[union-attr]
    assert {r["id"] for r in val_rows}.isdisjoint(held_out)
    saved = {name: saved_steps(found[name].output) for name in ("sft", "grpo")}
    assert len(saved["grpo"]) >= 2  # keep_checkpoints: 0 kept every step grpo saved
    steps = {
        name: [f"{name}@step{s}" for s in found_steps[:-1]] for name, found_steps in saved.items()
    }
    assert list(
        dict.fromkeys(r["model"] for r in val_rows)
    ) == [  # each model's steps, oldest first
        *steps["sft"],
        "sft",
        *steps["grpo"],
        "grpo",
    ]
    earlier = steps["grpo"][::-1]  # pick's order: each candidate, then its steps newest first
    grpo = found["grpo"].output
    accuracy = {
        m: float(np.mean([r["correct"] for r in val_rows if r["model"] == m]))
        for m in ("sft", "grpo", *earlier)  # pick's order: each candidate, then its steps
    }
    best = max(accuracy, key=lambda m: (accuracy[m], -list(accuracy).index(m)))
    expected = best if accuracy[best] > accuracy["sft"] else "sft"
    chosen_step = int(expected.split("@step")[1]) if "@step" in expected else None
    want = found[expected.split("@")[0]].output
    if chosen_step is not None:
        want = want.model_copy(update={"step": chosen_step})  # type: ignore[union-attr]
    assert found["pick"].output == want
    (pick_record,) = [s.record_uri for s in summary.stages if s.stage == "pick"]
    choice = storage.read_json(storage.join(record_directory(pick_record), "choice.json"))
    assert choice["chosen"] == expected and choice["incumbent"] == "sft"
    assert {c["name"]: c["accuracy"] for c in choice["candidates"]} == accuracy
    assert {c["name"]: c["step"] for c in choice["candidates"]}["grpo"] == grpo.step  # type: ignore[union-attr]
    scored = {s.name: s for s in found["evaluate_all"].output.scores}  # type: ignore[union-attr]
    assert scored["chosen"].checkpoint_uri == want.uri  # type: ignore[union-attr]


def test_status_lineage_and_audit_follow_the_dag(
    dag_run: tuple[Recipe, RunSummary], prefect_api: str
) -> None:
    recipe, summary = dag_run
    run_uri = summary.run_uri
    states = manifest.run_status(run_uri)
    assert [(s.stage, s.state) for s in states] == [(n, "complete") for n in build_dag(recipe).ids]
    assert lineage.audit(run_uri) == []
    tree = lineage.ancestry(records(summary)["evaluate_all"].output.uri)
    text = lineage.render(tree)
    for node_id in (
        "grpo_hard (grpo)",
        "hard (hard_subset)",
        "sft_self (sft)",
        "pairs (preferences)",
    ):
        assert node_id in text
    with on_api(prefect_api):
        again = format_align_reinforce(recipe, storage.normalize(recipe.storage_root))
    assert again.complete and all(s.skipped for s in again.stages)


def test_new_stages_stop_and_resume_where_the_flow_ended(
    dag_run: tuple[Recipe, RunSummary], tmp_path: Path
) -> None:
    """Each new stage in another root: stopped mid-way (or before its atomic step), then
    resumed, it commits what the uninterrupted flow committed."""
    recipe, summary = dag_run
    found = records(summary)
    dag = build_dag(recipe)

    def ctx(stop: StopFlag | None = None) -> RunContext:
        return RunContext(root=str(tmp_path), run="resumed", stop=stop)

    def twice(call: Any, checks: int) -> Any:
        with pytest.raises(SessionExpired):
            call(ctx(StopAfter(checks)))
        return call(ctx()).output

    dataset = found["data_prep"].output
    config = node_config(recipe, dag.node("self_teach"))
    taught = twice(
        lambda c: self_teach.teach(
            dataset, found["sft"].output, config, recipe.model, recipe.mesh, c
        ),
        checks=2,  # the stage start, chunk 0; stops before chunk 1
    )
    assert len(list((tmp_path / "resumed").glob("self_teach-*/chunks/*.jsonl"))) == 2
    assert taught.fingerprint == found["self_teach"].output.fingerprint

    hard = twice(
        lambda c: hard_subset.select(
            found["evaluate_train"].output, dataset, node_config(recipe, dag.node("hard")), c
        ),
        checks=0,
    )
    with pytest.raises(ValueError, match="scored the 'eval' split"):
        hard_subset.select(
            found["evaluate"].output, dataset, node_config(recipe, dag.node("hard")), ctx()
        )
    assert hard.fingerprint == found["hard"].output.fingerprint
    pairs = twice(
        lambda c: preferences.build(
            found["evaluate"].output, dataset, node_config(recipe, dag.node("pairs")), c
        ),
        checks=0,
    )
    assert pairs.fingerprint == found["pairs"].output.fingerprint

    optimized = twice(
        lambda c: dpo.optimize(
            found["sft"].output,
            pairs,
            node_config(recipe, dag.node("dpo")),
            recipe.model,
            recipe.mesh,
            c,
        ),
        checks=3,  # the stage start, batches 1 and 2; stops at step 2 of 3
    )
    record = lineage.find_record(optimized.uri)[1]
    assert [s.outcome for s in record.sessions] == ["stopped", "complete"]
    assert record.metrics["resumed_from_step"] == 2
    assert_same_params(optimized, found["dpo"].output)  # type: ignore[arg-type]


def test_distill_stops_and_resumes_to_the_flows_student(
    dag_run: tuple[Recipe, RunSummary], tmp_path: Path
) -> None:
    """Stopped at step 2 of 4 and resumed in another root, the student's weights equal the
    uninterrupted flow's bit for bit (restored optimizer state, replayed batch order)."""
    recipe, summary = dag_run
    found = records(summary)
    config = node_config(recipe, build_dag(recipe).node("distill"))

    def run(stop: StopFlag | None) -> Any:
        ctx = RunContext(root=str(tmp_path), run="resumed", stop=stop)
        return distill.distill(
            found["data_prep"].output, found["sft"].output, config, recipe.model, recipe.mesh, ctx
        )

    with pytest.raises(SessionExpired, match="distill stopped at step 2 of 4"):
        run(StopAfter(3))  # the stage start, batches 1 and 2
    student = run(None).output
    record = lineage.find_record(student.uri)[1]
    assert [s.outcome for s in record.sessions] == ["stopped", "complete"]
    assert record.metrics["resumed_from_step"] == 2
    assert student.step == 4 and student.lora is None
    assert_same_params(student, found["distill"].output)  # type: ignore[arg-type]


def lora_leaves(artifact: CheckpointArtifact, mesh: Any) -> list[np.ndarray]:
    policy = models.restore_policy(
        artifact, models.build_base_model(artifact.model, mesh, "unused"), mesh
    )
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(policy, nnx.LoRAParam))]


def max_abs_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    assert a and len(a) == len(b)
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def assert_same_params(a: CheckpointArtifact, b: CheckpointArtifact) -> None:
    """The trained parameters (LoRA adapters, or every weight when trained in full) are equal."""
    mesh = models.build_mesh(MeshSpec())
    leaves = []
    for artifact in (a, b):
        base = models.build_base_model(artifact.model, mesh, "unused")
        policy = models.restore_policy(artifact, base, mesh)
        trained = nnx.LoRAParam if artifact.lora else nnx.Param
        leaves.append([np.asarray(x) for x in jax.tree.leaves(nnx.state(policy, trained))])
    assert leaves[0] and len(leaves[0]) == len(leaves[1])
    assert all(np.array_equal(x, y) for x, y in zip(*leaves, strict=True))
