"""The whole recipe checked before compute, and `far validate`: every DAG node's rewards,
verify lists, preferences sources and data files; reward weights that cannot be meant;
duplicate YAML keys; a directory where a file belongs; the plan read from storage.

Each case runs `flows.cli.main` in this process (no Prefect server, no model build, no
training): exit 2 and one line naming the node, field or file, or the plan and exit 0.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows import cli
from flows.commands import run as run_command
from pipeline.dag import build_dag, node_config
from pipeline.manifest import manifest_uri
from pipeline.nodes import run_node
from pipeline.recipes import RecipeError, load_recipe, parse_recipe
from schemas.artifacts import CheckpointArtifact
from schemas.recipe import HardSubsetConfig, Recipe
from schemas.record import RunManifest, RunSummary, StageSummary
from stages import sft
from stages.core import storage
from stages.core.decisions import stage_directory
from stages.core.records import IDENTITY_NAME
from stages.core.runner import RunContext, StageIdentity, run_stage
from stages.evaluate import evaluation
from stages.grpo import training as grpo
from tests.conftest import REPO, smoke_data

DAG = yaml.safe_load((REPO / "recipes" / "smoke-dag.yaml").read_text())


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """`far` sets Prefect's defaults in os.environ (setdefault); keep them out of other tests."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _write(tmp_path: Path, data: dict[str, Any], name: str = "recipe.yaml") -> str:
    data = {**data, "storage_root": str(tmp_path / "runs")}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _dag_with(node_id: str, **changes: Any) -> dict[str, Any]:
    """recipes/smoke-dag.yaml with one node's fields replaced."""
    nodes = [{**n, **changes} if n["id"] == node_id else n for n in DAG["pipeline"]]
    return {**DAG, "pipeline": nodes}


def _far(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _refused(capsys: pytest.CaptureFixture[str], recipe: str, pattern: str) -> None:
    code, out, err = _far(capsys, "validate", recipe)
    assert code == cli.EXIT_INVALID, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line, no traceback
    assert lines[0].startswith("far: ")
    assert re.search(pattern, lines[0]), lines[0]


def test_unknown_reward_of_a_grpo_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {"max_steps": 2, "batch_size": 2, "rewards": {"answer_matchs": 1.0}}
    recipe = _write(tmp_path, _dag_with("grpo_hard", config=config))
    _refused(capsys, recipe, r"node 'grpo_hard' \(grpo\): config\.rewards: unknown reward")


def test_unknown_reward_in_a_self_teach_verify_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = _write(tmp_path, _dag_with("self_teach", config={"verify": ["format_strictt"]}))
    _refused(capsys, recipe, r"'self_teach' \(self_teach\): config\.verify: unknown reward")


def test_preferences_with_a_file_and_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    recipe = _write(tmp_path, _dag_with("pairs", config={"file": str(pairs)}))
    _refused(capsys, recipe, r"'pairs' \(preferences\): config\.file: .* both give pairs")


def test_preferences_with_neither_a_file_nor_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = _write(tmp_path, _dag_with("pairs", inputs={}))
    _refused(capsys, recipe, r"'pairs' \(preferences\): config\.file: .* no pairs to read")


def test_preferences_file_that_is_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "pairs-folder"
    folder.mkdir()
    recipe = _write(tmp_path, _dag_with("pairs", inputs={}, config={"file": str(folder)}))
    _refused(capsys, recipe, r"pairs-folder is a directory; expected a preference pairs file")


def test_data_file_of_a_pipeline_data_prep_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = dict(DAG["data"])
    gone = {"kind": "file", "name": str(tmp_path / "gone.jsonl"), "adapter": "gsm8k"}
    data["eval"] = {"size": 2, "sources": [gone]}
    recipe = _write(tmp_path, _dag_with("data_prep", config=data))
    _refused(capsys, recipe, r"'data_prep' \(data_prep\): config\.eval\.sources\[0\]\.name: .*")


def test_data_source_that_is_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = smoke_data()
    folder = tmp_path / "rows"
    folder.mkdir()
    data["data"]["eval"] = {
        "size": 2,
        "sources": [{"kind": "file", "name": str(folder), "adapter": "gsm8k"}],
    }
    recipe = _write(tmp_path, data)
    _refused(capsys, recipe, r"data\.eval\.sources\[0\]\.name: .*rows is a directory; expected")


def test_recipe_that_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(capsys, str(tmp_path), r"recipe .* is a directory; expected a recipe YAML file")


def test_duplicate_keys_are_named_with_their_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = yaml.safe_dump(smoke_data(), sort_keys=False)
    text = text.replace("\nsft:\n", "\nsft:\n  max_steps: 7\n", 1)  # a second max_steps in sft
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    code, _, err = _far(capsys, "validate", str(path))
    assert code == cli.EXIT_INVALID
    assert "duplicate key 'max_steps' at line" in err and "(first at line" in err
    once = _write(tmp_path, smoke_data(), "once.yaml")
    code, _, err = _far(
        capsys, "validate", once, "grpo.rewards={format_strict: 1, format_strict: 2}"
    )
    assert code == cli.EXIT_INVALID and "duplicate key 'format_strict' at line 1" in err


SMOKE_SFT_DATA = "  sft: {size: 128, sources: [*arithmetic]}\n"


def test_merge_keys_merge_and_duplicates_beside_them_are_still_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On main the duplicate-key loader refused every `<<: *anchor` (no constructor for the
    merge tag), an idiom that loaded before it."""
    text = (REPO / "recipes" / "smoke.yaml").read_text()
    assert SMOKE_SFT_DATA in text
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        text.replace(
            SMOKE_SFT_DATA, "  sft: {size: 128, sources: [{<<: *arithmetic, size: 900}]}\n"
        )
    )
    (source,) = load_recipe(str(merged)).data.sft.sources
    assert (source.kind, source.name, source.size) == ("reasoning_gym", "basic_arithmetic", 900)
    assert source.args == {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    twice = tmp_path / "twice.yaml"
    line = "  sft: {size: 128, sources: [{<<: *arithmetic, size: 900, size: 901}]}\n"
    twice.write_text(text.replace(SMOKE_SFT_DATA, line))
    code, _, err = _far(capsys, "validate", str(twice))
    assert code == cli.EXIT_INVALID and "duplicate key 'size' at line" in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"format_strict": math.nan}, r"weight nan; expected a finite number"),
        ({"format_strict": math.inf}, r"weight inf; expected a finite number"),
        ({"format_strict": 0.0, "answer_match": 0.0}, r"every reward weight is 0"),
        ({"format_strict": -1.0, "answer_match": 1.0}, r"grpo\.rewards: negative weight"),
    ],
    ids=["nan", "inf", "all-zero", "negative"],
)
def test_reward_weights_that_cannot_be_meant(weights: dict[str, float], message: str) -> None:
    data = smoke_data()
    data["grpo"] = {**data["grpo"], "rewards": weights}
    with pytest.raises(RecipeError, match=message):
        parse_recipe(data, "weights")


def test_negative_weights_when_the_recipe_says_so() -> None:
    data = smoke_data()
    data["grpo"] = {**data["grpo"], "rewards": {"format_strict": -1.0, "answer_match": 1.0}}
    recipe = parse_recipe({**data, "allow_negative_reward_weights": True}, "said")
    assert recipe.grpo.rewards["format_strict"] == -1.0


def test_negative_weight_of_a_pipeline_grpo_node() -> None:
    config = {"max_steps": 2, "batch_size": 2, "rewards": {"answer_match": -0.5}}
    with pytest.raises(RecipeError, match=r"node 'grpo_hard' config\.rewards: negative"):
        parse_recipe(_dag_with("grpo_hard", config=config), "dag")


def test_export_target_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"x")
    code, _, err = _far(capsys, "export", str(tmp_path / "ckpt"), str(target))
    assert code == cli.EXIT_INVALID
    assert "export target" in err and "is a file; expected a directory" in err
    code, _, err = _far(capsys, "export", str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert code == cli.EXIT_INVALID and "no committed FAR checkpoint at" in err


def test_plan_of_a_new_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _far(capsys, "validate", _write(tmp_path, DAG))
    assert code == 0, err
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [r[0] for r in rows][:4] == ["data_prep", "sft", "grpo", "evaluate"]
    assert len(rows) == len(DAG["pipeline"]) and all(r[3] == "run" for r in rows)
    assert not (tmp_path / "runs" / "smoke-dag").exists()  # nothing written but the probe


def test_the_plan_lists_what_each_evaluate_node_scores_and_warns_of_ignored_eval_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A pipeline's evaluate node scores 'base' and its checkpoint inputs: a recipe-level
    eval.models it does not score is said, naming the node (it silently scored only base)."""
    nodes = [
        {"id": "data_prep", "kind": "data_prep"},
        {"id": "sft", "kind": "sft", "inputs": {"dataset": "data_prep"}},
        {"id": "evaluate", "kind": "evaluate", "inputs": {"dataset": "data_prep"}},
        {"id": "scores_sft", "kind": "evaluate", "inputs": {"dataset": "data_prep", "sft": "sft"}},
    ]
    eval_section = {**DAG["eval"], "models": ["base", "sft"]}
    recipe = _write(tmp_path, {**DAG, "eval": eval_section, "pipeline": nodes})
    with caplog.at_level(logging.WARNING, logger="pipeline.validate"):
        code, out, err = _far(capsys, "validate", recipe)
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert rows["evaluate"].endswith("(scores base)")
    assert rows["scores_sft"].endswith("(scores base, sft)")
    assert "scores" not in rows["sft"].split("run", 1)[1]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("pipeline node 'evaluate' (evaluate) scores ['base'], not ")
    assert "eval.models ['base', 'sft']" in warning
    code, out, _ = _far(capsys, "validate", recipe, "--json")
    shown = json.loads(out)
    assert shown["warnings"] == [warning]
    assert [n["models"] for n in shown["nodes"]] == [None, None, ["base"], ["base", "sft"]]
    # the recipe's models scored by every node, or left at their default: nothing to say
    caplog.clear()
    for models in (["sft", "base"], None):
        section = {**DAG["eval"], **({"models": models} if models else {})}
        data = {**DAG, "eval": section, "pipeline": [*nodes[:2], nodes[3]]}
        with caplog.at_level(logging.WARNING, logger="pipeline.validate"):
            assert _far(capsys, "validate", _write(tmp_path, data))[0] == 0
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_validate_on_a_fresh_root_leaves_it_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The writability probe goes to the nearest directory that exists, and is deleted: a
    root that did not exist still does not, and nothing else appears (was: empty dirs)."""
    recipe = _write(tmp_path, smoke_data())
    before = sorted(p.name for p in tmp_path.iterdir())
    root = tmp_path / "fresh" / "deep" / "root"
    code, _, err = _far(capsys, "validate", recipe, "--root", str(root))
    assert code == 0, err
    assert not (tmp_path / "fresh").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_validate_refuses_a_root_under_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a_file").write_text("not a directory")
    recipe = _write(tmp_path, smoke_data())
    code, _, err = _far(capsys, "validate", recipe, "--root", str(tmp_path / "a_file" / "runs"))
    assert code == cli.EXIT_INVALID
    assert err.count("\n") == 1 and "is not writable" in err, err


def _started_manifest(tmp_path: Path, path: str) -> RunContext:
    """The run of the recipe at `path` as a first session leaves it: its run.json."""
    recipe = load_recipe(path)
    ctx = RunContext(root=str(tmp_path / "runs"), run=recipe.name)
    manifest = RunManifest(
        run=recipe.name,
        recipe=recipe.model_dump(mode="json"),
        recipe_source=path,
        created_at=datetime.now(UTC),
    )
    storage.write_json(manifest_uri(ctx.run_uri), manifest.model_dump(mode="json"))
    return ctx


def _checkpoint(recipe: Recipe, step: int) -> Callable[[str], Any]:
    """A stage's work that writes a checkpoint at `step` (no training)."""

    def work(directory: str) -> tuple[CheckpointArtifact, dict[str, float], dict[str, Any]]:
        checkpoints = storage.join(directory, "checkpoints")
        storage.write_bytes(storage.join(checkpoints, f"{step}/w"), directory.encode())
        artifact = CheckpointArtifact(
            uri=checkpoints,
            step=step,
            model=recipe.model,
            tokenizer="bytes-v1",
            lora=recipe.sft.lora,
            size_bytes=1,
            fingerprint=storage.tree_fingerprint(checkpoints),
        )
        return artifact, {}, {}

    return work


def _commit(ctx: RunContext, node: str, identity: StageIdentity, work: Callable[[str], Any]) -> Any:
    """`node` committed under `identity` (what its stage computes) with `work` as its work."""
    return run_stage(dataclasses.replace(ctx, node=node), identity, work).output


def _started_run(tmp_path: Path, sft_version: int = sft.STAGE_VERSION) -> tuple[str, RunContext]:
    """The smoke recipe's run: data_prep run for real; sft committed and grpo stopped at step
    3 under the identities their stages compute (sft's as started by `sft_version`)."""
    path = _write(tmp_path, smoke_data())
    recipe = load_recipe(path)
    ctx = _started_manifest(tmp_path, path)
    prep = build_dag(recipe).nodes[0]
    dataset = run_node(recipe, prep, node_config(recipe, prep), {}, ctx).output
    identity = sft.identity(recipe.sft, recipe.model, dataset.fingerprint)
    identity = dataclasses.replace(identity, version=sft_version)
    policy = _commit(ctx, "sft", identity, _checkpoint(recipe, 1))
    grpo_identity = grpo.identity(
        recipe.grpo, recipe.model, dataset.fingerprint, policy.fingerprint
    )
    directory = stage_directory(dataclasses.replace(ctx, node="grpo"), "grpo", grpo_identity.digest)
    identity_json = {
        "version": grpo.STAGE_VERSION,
        "created_at": "2026-01-01T00:00:00",
        "config": grpo_identity.config,
        "inputs": grpo_identity.inputs,
    }
    storage.write_json(storage.join(directory, IDENTITY_NAME), identity_json)
    storage.write_bytes(storage.join(directory, "checkpoints/actor/3/w"), b"w")
    return path, ctx


def _rows(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in out.splitlines()[2:]}


def test_plan_refuses_a_stage_whose_code_version_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bumped STAGE_VERSION is drift: refused when that stage starts, so the flow ends there."""
    now = sft.STAGE_VERSION
    path, _ = _started_run(tmp_path, sft_version=now - 1)
    code, out, err = _far(capsys, "validate", path)
    assert code == cli.EXIT_INVALID
    assert f"refused by the drift guard: code.sft_version: {now - 1} -> {now}" in err
    rows = _rows(out)
    assert rows["data_prep"][3] == "skip"
    assert rows["sft"][3] == "refused" and f"code.sft_version: {now - 1} -> {now}" in out
    assert rows["grpo"][2:] == ["-", "-", "not", "reached"]
    code, out, _ = _far(capsys, "validate", path, "--allow-change", "code.sft_version")
    assert code == 0
    rows = _rows(out)
    assert [rows[n][3] for n in ("data_prep", "sft", "grpo", "evaluate")] == [
        "skip",
        "run",
        "depends",  # grpo's directory: used if sft's new checkpoint is the old one
        "run",
    ]


def test_plan_reads_what_is_complete_partial_or_not_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, ctx = _started_run(tmp_path)
    code, out, err = _far(capsys, "validate", path)
    assert code == 0, err
    rows = _rows(out)
    sft_dir = next(n for n in storage.list_dirs(ctx.run_uri) if n.startswith("sft-"))
    grpo_dir = next(n for n in storage.list_dirs(ctx.run_uri) if n.startswith("grpo-"))
    assert rows["data_prep"][3] == "skip" and rows["sft"][3] == "skip"
    assert rows["sft"][2] == sft_dir.rsplit("-", 1)[1]  # the stage hash of its directory
    assert rows["grpo"][2:] == [grpo_dir.rsplit("-", 1)[1], "continue", "from", "step", "3/4"]
    assert rows["evaluate"][3] == "run"


def test_plan_refused_by_the_drift_guard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _started_run(tmp_path)
    code, out, err = _far(capsys, "validate", path, "sft.max_steps=9")
    assert code == cli.EXIT_INVALID
    assert "refused by the drift guard: sft.max_steps:" in err
    assert "--allow-change sft.max_steps" in err
    assert all(line.split()[3] == "refused" for line in out.splitlines()[2:])
    code, out, err = _far(capsys, "validate", path, "sft.max_steps=9", "--allow-change", "sft")
    assert code == 0, err
    rows = _rows(out)
    assert rows["data_prep"][3] == "skip"
    # a continuation setting: sft resumes its checkpoint in a new directory
    assert rows["sft"][3] == "continue" and "checkpoint in a new directory" in out
    assert "sft.max_steps: 150 -> 9" in " ".join(rows["sft"])
    assert rows["grpo"][3] == "depends"  # on what sft's new checkpoint is


def test_plan_of_a_dag_whose_one_node_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A changed pipeline node is drift of that node alone: the plan names its setting, runs it
    and what reads it, and skips the rest (a list diff once refused and re-ran every node)."""
    path = _write(tmp_path, DAG)
    recipe = load_recipe(path)
    ctx = _started_manifest(tmp_path, path)
    dag = build_dag(recipe)
    prep = dag.node("data_prep")
    dataset = run_node(recipe, prep, node_config(recipe, prep), {}, ctx).output
    sft_config = node_config(recipe, dag.node("sft"))
    sft_id = sft.identity(sft_config, recipe.model, dataset.fingerprint)
    policy = _commit(ctx, "sft", sft_id, _checkpoint(recipe, 1))
    grpo_config = node_config(recipe, dag.node("grpo"))
    grpo_id = grpo.identity(grpo_config, recipe.model, dataset.fingerprint, policy.fingerprint)
    trained = _commit(ctx, "grpo", grpo_id, _checkpoint(recipe, 2))
    train_config = node_config(recipe, dag.node("evaluate_train"))
    fingerprints = {"grpo": trained.fingerprint}
    train_id = evaluation.identity(train_config, recipe.model, dataset.fingerprint, fingerprints)
    _commit(ctx, "evaluate_train", train_id, _checkpoint(recipe, 1))  # any committed output
    train = next(n for n in DAG["pipeline"] if n["id"] == "evaluate_train")
    changed = _dag_with("evaluate_train", config={**train["config"], "seed": 7})
    code, _, err = _far(capsys, "validate", _write(tmp_path, changed, "changed.yaml"))
    assert code == cli.EXIT_INVALID
    assert "pipeline.evaluate_train.config.seed: 0 -> 7" in err and '"kind"' not in err
    code, out, err = _far(
        capsys, "validate", _write(tmp_path, changed, "changed.yaml"), "--allow-change", "pipeline"
    )
    assert code == 0, err
    rows = _rows(out)
    assert [rows[n][3] for n in ("data_prep", "sft", "grpo")] == ["skip"] * 3
    assert rows["evaluate_train"][3:] == ["run", "eval.seed:", "0", "->", "7", "(scores", "grpo)"]
    assert rows["hard"][3:] == ["run", "after", "evaluate_train"]


def test_version_and_exit_codes_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("far ")
    text = cli.build_parser().format_help()
    for code in ("0 done", "1 `far audit`", "2 invalid", "3 stopped", "4 another session"):
        assert code in " ".join(text.split()), code


def test_summary_shows_the_last_evaluation_of_any_node_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The report of an evaluate node with any id (not only one named `evaluate`), as one
    table of its models, and the report.md that holds every table named beside it."""
    from schemas.artifacts import EvalReport, ModelScores

    folder = tmp_path / "evaluate_all"
    folder.mkdir()
    scores = [
        ModelScores(
            name=name,
            checkpoint_uri=None,
            num_prompts=8,
            format_rate=rate,
            accuracy=rate,
            mean_completion_chars=10.0,
        )
        for name, rate in (("base", 0.0), ("sft", 0.5))
    ]
    report = EvalReport(
        uri=str(folder / "report.json"),
        samples_uri=str(folder / "samples.jsonl"),
        scores=scores,
        fingerprint="0" * 64,
    )
    (folder / "report.json").write_text(report.model_dump_json())
    stages = [
        StageSummary(stage=node, output_uri=str(output), record_uri="", skipped=True, seconds=0.0)
        for node, output in (("evaluate_all", folder / "report.json"), ("sft", tmp_path / "c"))
    ]
    summary = RunSummary(run="r", run_uri=str(tmp_path), complete=True, stages=stages, seconds=1.0)
    run_command.print_summary(summary)
    out = capsys.readouterr().out
    rows = [
        line.split()[:3] for line in out.splitlines() if line.split()[1:2] in (["0.000"], ["0.500"])
    ]
    assert rows == [["base", "0.000", "0.000"], ["sft", "0.500", "0.500"]], out
    assert "evaluate_all/report.md" in out


def test_the_far_executable_refuses_a_bad_node_before_compute(tmp_path: Path) -> None:
    """As a user runs it: the installed `far validate`, one line on stderr, exit 2."""
    import subprocess

    from tests.conftest import BIN

    recipe = _write(tmp_path, _dag_with("self_teach", config={"verify": ["no_such_reward"]}))
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(BIN / "far"), "validate", recipe], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "unknown reward 'no_such_reward'" in done.stderr
    assert done.stdout == ""


def test_validate_where_the_sandbox_cannot_run(tmp_path: Path) -> None:
    """Without bubblewrap on PATH the bwrap isolation is refused: one line, exit 2."""
    import subprocess

    from tests.conftest import BIN

    env = {"PATH": str(BIN), "JAX_PLATFORMS": "cpu", "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(BIN / "far"), "validate", _write(tmp_path, smoke_data())],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "bubblewrap is not installed" in done.stderr


def test_an_unregistered_kind_is_refused_naming_the_node_and_the_kinds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kind nothing registers parses (schemas/ cannot know the registry) and is refused by the
    DAG check: exit 2, naming the node, the kind and the kinds that are registered."""
    recipe = _write(tmp_path, _dag_with("sft", kind="sft_lora"))
    _refused(capsys, recipe, r"sft: no stage kind 'sft_lora' is registered; kinds: \['data_prep'")


HARD = next(n for n in DAG["pipeline"] if n["id"] == "hard")
SAMPLED = {"models": ["grpo"], "split": "grpo_train", "temperature": 0.9, "samples": 2}


@pytest.mark.parametrize(
    ("hard", "evaluation", "pattern"),
    [
        ({"min_prompts": 50}, {}, r"config\.min_prompts: 50 is more than the 8 prompts"),
        ({"model": "grp"}, {}, r"config\.model: 'grp' is not a model evaluate_train evaluates"),
        ({"by": "reward/format_strict"}, {}, r"config\.by: evaluate_train does not score"),
        ({"above": 0.0}, {}, r"config\.above: .* always empty"),
        (
            {"above": 0.0},
            SAMPLED,
            r"config\.above: evaluate_train samples 2 .* fewer than the group of 4",
        ),
    ],
    ids=["min-prompts", "model-label", "unscored-reward", "greedy-band", "samples-below-group"],
)
def test_hard_subset_mistakes_are_refused_before_compute(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    hard: dict[str, Any],
    evaluation: dict[str, Any],
    pattern: str,
) -> None:
    """Each used to surface only after data_prep, SFT, GRPO and the evaluation ran."""
    data = _dag_with("hard", config={**HARD["config"], **hard})
    if evaluation:
        train = next(n for n in data["pipeline"] if n["id"] == "evaluate_train")
        nodes = [{**n, "config": evaluation} if n is train else n for n in data["pipeline"]]
        data = {**data, "pipeline": nodes}
    _refused(capsys, _write(tmp_path, data), rf"node 'hard' \(hard_subset\): {pattern}")


def test_a_sampled_band_and_a_labelled_greedy_row_are_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _dag_with("hard", config={**HARD["config"], "above": 0.0})
    sampled = {**SAMPLED, "samples": 4}
    nodes = [
        {**n, "config": sampled} if n["id"] == "evaluate_train" else n for n in data["pipeline"]
    ]
    code, _, err = _far(capsys, "validate", _write(tmp_path, {**data, "pipeline": nodes}))
    assert code == 0, err


def test_an_empty_band_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """No prompt in the band: the top-up to min_prompts is said as a WARNING (was INFO)."""
    from stages import hard_subset

    config = HardSubsetConfig(model="grpo", above=0.0, min_prompts=2)
    with caplog.at_level(logging.INFO, logger="stages.hard_subset"):
        hard_subset.log_selection(kept=2, rows=8, failed=4, banded=0, config=config)
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "no prompt in the band" in warning.getMessage() and "no gradient" in warning.getMessage()


def test_a_far_run_line_checks_by_swapping_the_verb(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every `far run` option is accepted by `far validate` (the budget is checked as well)."""
    options = ["--session-budget", "9h", "--lease-wait", "5", "--distributed"]
    options += ["--compile-cache", str(tmp_path / "cc"), "--allow-change", "sft", "sft.max_steps=3"]
    code, out, err = _far(capsys, "validate", _write(tmp_path, smoke_data()), *options)
    assert code == 0, err
    assert "valid; run 'smoke'" in out
    code, _, err = _far(capsys, "validate", _write(tmp_path, smoke_data()), "--session-budget", "x")
    assert code == cli.EXIT_INVALID and "session_budget" in err
