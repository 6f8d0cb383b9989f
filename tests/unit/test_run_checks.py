"""Run-level checks before any compute (pipeline/validate.py), `far run` KEY=VALUE overrides,
progress lines, and the commit baked in at install for records written without .git."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from pipeline import validate
from pipeline.plan import plan_run
from pipeline.recipes import RecipeError
from schemas.recipe import EvalConfig, MeshSpec, ModelSpec
from stages.core import provenance
from stages.core.errors import InputError, MissingInput, UnreachableInput, is_input_error
from stages.core.progress import ProgressPrinter, ProgressUpdate, reporting
from tests.conftest import REPO, SMOKE, recipe_with


def test_unknown_reward_is_named_with_the_registered_ones(tmp_path: Path) -> None:
    recipe = recipe_with(str(tmp_path), grpo={"rewards": {"answer_matches": 1.0}})
    with pytest.raises(InputError, match=r"grpo\.rewards: unknown reward 'answer_matches'.*"):
        validate.check_rewards(recipe.grpo)


def test_mesh_larger_than_the_machine() -> None:
    import jax

    too_many = jax.device_count() + 1
    with pytest.raises(InputError, match=rf"mesh: fsdp={too_many} x tp=1 needs {too_many} dev"):
        validate.check_mesh(MeshSpec(fsdp=too_many, tp=1))
    validate.check_mesh(MeshSpec(fsdp=1, tp=1))  # the control


def test_storage_root_that_cannot_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(InputError, match=r"storage_root .*a-file/runs is not writable"):
        validate.check_storage_writable(str(blocker / "runs"))
    validate.check_storage_writable(str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()  # probed where it would be made, and nothing left
    assert list(tmp_path.iterdir()) == [blocker]


def test_missing_data_file_names_its_field(tmp_path: Path) -> None:
    gone = {"kind": "file", "name": str(tmp_path / "gone.jsonl"), "adapter": "gsm8k"}
    recipe = recipe_with(str(tmp_path), data={"grpo": {"size": 2, "sources": [gone]}})
    with pytest.raises(MissingInput, match=r"data\.grpo\.sources\[0\]\.name: .*gone\.jsonl"):
        validate.check_data_files(recipe.data)


def test_evaluation_checkpoint_uri_that_holds_no_checkpoint(tmp_path: Path) -> None:
    config = EvalConfig(models=["base", str(tmp_path / "sft-0123/checkpoints")])
    with pytest.raises(MissingInput, match=r"eval\.models\[1\]: no committed FAR checkpoint"):
        validate.check_eval_checkpoints(config)


def test_offline_hub_is_a_clear_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = ModelSpec(
        family="gemma3",
        source="hub",
        uri="far-test/no-such-model",
        preset="gemma3_270m",
        tokenizer="sentencepiece",
    )
    with pytest.raises(UnreachableInput, match=r"(?s)far-test/no-such-model.*Offline, use"):
        validate.check_model(spec, str(tmp_path))


def test_input_errors_are_found_through_the_cause_chain() -> None:
    try:
        try:
            raise MissingInput("data source file not found: x.jsonl")
        except MissingInput as e:
            raise RuntimeError("a task failed") from e
    except RuntimeError as wrapped:
        assert is_input_error(wrapped)
    assert not is_input_error(RuntimeError("a defect"))


def test_overrides_by_dotted_path_are_validated_by_the_schema(tmp_path: Path) -> None:
    plan = plan_run(str(SMOKE), str(tmp_path), assignments=["sft.max_steps=7", "grpo.beta=0"])
    assert plan.recipe.sft.max_steps == 7 and plan.recipe.grpo.beta == 0
    given = ["eval.models=[base, sft]", "grpo.rewards={answer_match: 2.0}"]
    plan = plan_run(str(SMOKE), str(tmp_path), assignments=given)
    assert plan.recipe.eval.models == ["base", "sft"]
    assert plan.recipe.grpo.rewards == {"answer_match": 2.0}


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("sft.max_steps=-3", r"sft\.max_steps: Input should be greater than 0"),
        ("sft.max_step=3", r"sft\.max_step: Extra inputs are not permitted"),
        ("sft.max_steps", r"expected KEY=VALUE"),
        ("sft.max_steps.deeper=3", r"sft\.max_steps is 150, not a mapping"),
        ("grpo.rewards={a: [", r"not valid YAML"),
    ],
)
def test_bad_overrides_are_refused_naming_the_path(
    tmp_path: Path, assignment: str, message: str
) -> None:
    with pytest.raises(RecipeError, match=message):
        plan_run(str(SMOKE), str(tmp_path), assignments=[assignment])


def test_progress_reports_each_optimizer_step_with_eta() -> None:
    seen: list[ProgressUpdate] = []
    items = list(reporting(iter(range(6)), seen.append, "sft", 10, 13, items_per_step=2))
    assert items == list(range(6))
    assert [u.step for u in seen] == [11, 12, 13]
    assert seen[-1].eta_seconds == 0 and seen[1].eta_seconds is not None
    assert seen[0].eta_seconds is None  # the first step compiles: no steady rate yet
    assert seen[0].describe().startswith("sft 11/13 (85%)")


def test_progress_off_a_terminal_is_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    printer = ProgressPrinter(io.StringIO(), every_seconds=3600, every_steps=5, tty=False)
    with caplog.at_level("INFO", logger="stages.core.progress"):
        for step in range(1, 13):
            printer(ProgressUpdate("grpo", step, 12, 0.5, {"reward": 1.25}))
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split()[2] for line in lines] == ["1/12", "5/12", "10/12", "12/12"]
    assert "reward 1.25 | 0.5 s/step | ETA 0 s" in lines[-1]


def test_progress_on_a_terminal_redraws_one_bar() -> None:
    stream = io.StringIO()
    printer = ProgressPrinter(stream, tty=True)
    for step in (1, 2):
        printer(ProgressUpdate("sft", step, 2, 0.25, {"loss": 0.5}))
    drawn = stream.getvalue()
    assert "sft 2/2 |" in drawn and "loss 0.5 | 0.25 s/step | ETA 0 s" in drawn
    assert drawn.endswith("\n")  # the finished bar stays


def test_commit_is_read_from_build_info_without_git(tmp_path: Path) -> None:
    info = tmp_path / "_build_info.json"
    info.write_text(json.dumps({"git_commit": "0123abc"}))
    no_repo = tmp_path / "not-a-checkout"
    no_repo.mkdir()
    assert provenance._git_commit(no_repo, info) == "0123abc"
    assert provenance._git_commit(no_repo, tmp_path / "absent.json") is None


def test_make_build_info_bakes_in_head(tmp_path: Path) -> None:
    target = tmp_path / "info.json"
    subprocess.run(
        ["make", "--no-print-directory", "build-info", f"BUILD_INFO={target}"],
        cwd=REPO,
        check=True,
    )
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert provenance.baked_commit(target) == head


def test_overrides_are_recorded_in_run_json_as_given(tmp_path: Path) -> None:
    from pipeline import manifest
    from stages.core.drift import DriftError
    from stages.core.runner import RunContext

    given = ["sft.max_steps=7"]
    plan = plan_run(str(SMOKE), str(tmp_path), assignments=given)
    ctx = RunContext(root=plan.root, run=plan.recipe.name)
    manifest.open_session(plan.recipe, ctx, str(SMOKE), overrides=given)
    written = manifest.read_manifest(ctx.run_uri)
    assert written.invocations[-1].overrides == given
    assert written.recipe["sft"]["max_steps"] == 7
    # the next session without the override is a recipe edit to the drift guard
    plain = plan_run(str(SMOKE), str(tmp_path)).recipe
    with pytest.raises(DriftError, match=r"sft\.max_steps"):
        manifest.open_session(plain, ctx, str(SMOKE))


def test_overrides_may_follow_options_on_the_command_line() -> None:
    from flows import cli

    parser = cli.build_parser()
    args = cli.parse_arguments(parser, ["run", "r.yaml", "a.b=1", "--root", "x", "sft.max_steps=3"])
    assert args.overrides == ["a.b=1", "sft.max_steps=3"] and args.root == "x"
    with pytest.raises(SystemExit):
        cli.parse_arguments(parser, ["run", "r.yaml", "--no-such-option"])
    with pytest.raises(SystemExit):
        cli.parse_arguments(parser, ["status", "runs/x", "a.b=1"])


def test_far_draws_the_bar_of_every_stage_that_reports_progress() -> None:
    """SFT and GRPO too (FAR left them to Tunix's bar, which counts the compiling first step
    in its ETA; tunix_compat.hide_progress_bar keeps it from drawing a second one)."""
    for stage in ("sft", "grpo", "evaluate"):
        stream = io.StringIO()
        ProgressPrinter(stream, tty=True)(ProgressUpdate(stage, 1, 2, 0.25, {"loss": 0.5}))
        assert f"{stage} 1/2 |" in stream.getvalue()


def test_the_commit_is_read_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout whose HEAD moves during a run does not change the commit its later records
    name: the first answer stands for the process (records and run tags alike)."""
    provenance.git_commit.cache_clear()
    first = provenance.git_commit()
    monkeypatch.setattr(provenance, "_git_commit", lambda *args: "moved-on")
    assert provenance.git_commit() == first
    assert provenance.code_version(1).git_commit == first
    provenance.git_commit.cache_clear()
    assert provenance.git_commit() == "moved-on"
    provenance.git_commit.cache_clear()  # the next caller reads the real checkout again
