"""What a person reads at the terminal: `far run`'s summary block (one table that fits 100
columns, the commands to run next), `far --help` (commands first, exit codes last), the
bundled recipes by name, a did-you-mean for a mistyped recipe, whole-sentence descriptions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flows.cli import build_parser, main
from flows.console_summary import WIDTH, summary_lines
from pipeline.recipes import BUNDLED, RecipeError, bundled_recipes, load_recipe, resolve_recipe_uri
from schemas.artifacts import EvalReport, ModelScores
from schemas.record import RunSummary, StageSummary
from stages.core import storage

ROOT = "sha256:" + "ab" * 32


def _scores(name: str, accuracy: float, vs: dict[str, float]) -> ModelScores:
    metrics = {"accuracy_ci_low": 0.1, "accuracy_ci_high": 0.49}
    metrics |= {"format_rate_ci_low": 0.72, "format_rate_ci_high": 0.99}
    return ModelScores(
        name=name,
        checkpoint_uri=None,
        num_prompts=16,
        format_rate=0.938,
        accuracy=accuracy,
        mean_completion_chars=40.0,
        metrics=metrics | {f"vs_previous/{k}": v for k, v in vs.items()},
    )


def _summary(run_uri: str, complete: bool = True) -> RunSummary:
    report_uri = storage.join(run_uri, "evaluate-abc", "report.json")
    report = EvalReport(
        uri=report_uri,
        samples_uri=storage.join(run_uri, "evaluate-abc", "samples.jsonl"),
        scores=[
            _scores("base", 0.0, {}),
            _scores("a-long-model-name-from-a-pick-node@step40@greedy", 0.25, {}),
            _scores("sft", 0.25, {"difference": 0.25, "p_value": 0.125}),
        ],
        fingerprint="0" * 64,
    )
    storage.write_json(report_uri, report.model_dump(mode="json"))
    stages = [
        StageSummary(
            stage="sft",
            output_uri=f"{run_uri}/sft-1/checkpoints",
            record_uri="r",
            skipped=False,
            seconds=3.0,
        ),
        StageSummary(
            stage="evaluate", output_uri=report_uri, record_uri="r", skipped=True, seconds=0.0
        ),
    ]
    return RunSummary(
        run="smoke",
        run_uri=run_uri,
        complete=complete,
        stages=stages,
        seconds=4.0,
        stopped_reason=None if complete else "session budget reached",
        ledger_root=ROOT,
    )


def test_the_summary_is_one_titled_block_that_fits_and_says_what_next(tmp_path: Path) -> None:
    run_uri = storage.normalize(str(tmp_path / "smoke"))
    lines = summary_lines(_summary(run_uri), environ={})
    text = "\n".join(lines)
    assert lines[0] == f"\nFAR run 'smoke' at {run_uri}: complete"
    assert "  sft        ran in 3.0 s" in text and " sft-1/checkpoints" in text  # relative
    commands = [line for line in lines if line.startswith(("  far export", "  far audit"))]
    paths = [lines[0], *commands]  # the title and commands name the run's URI, however long
    assert all(len(line) <= WIDTH for line in lines if line not in paths), text
    assert text.count("| ") == 0  # no raw markdown table
    assert "+0.250 (McNemar p 0.12)" in text and "evaluate-abc/report.md" in text
    assert (
        lines[lines.index("Next:") + 1]
        == f"  far export {run_uri}/sft-1/checkpoints ./smoke-export"
    )
    assert f"  far audit {run_uri} --expect-root {ROOT}" in lines
    assert "prefect server start" in lines[-1]  # no kept server: how to get one


def test_a_users_reward_the_evaluation_scored_is_shown_with_each_models_mean() -> None:
    from flows.console_summary import evaluation_lines

    scores = [
        _scores("base", 0.0, {}).model_copy(update={"metrics": {"reward/plain_number": 0.0}}),
        _scores("sft", 0.25, {}).model_copy(update={"metrics": {"reward/plain_number": 0.875}}),
    ]
    report = EvalReport(uri="r/e/report.json", samples_uri="s", scores=scores, fingerprint="0" * 64)
    lines = evaluation_lines(report, "r")
    assert "  plain_number (mean): base 0.000, sft 0.875" in lines
    assert all(len(line) <= WIDTH for line in lines)


def test_an_incomplete_run_says_to_continue_and_a_kept_server_is_linked(tmp_path: Path) -> None:
    run_uri = storage.normalize(str(tmp_path / "smoke"))
    lines = summary_lines(
        _summary(run_uri, complete=False), environ={"PREFECT_API_URL": "http://h:4200/api"}
    )
    assert "INCOMPLETE (session budget reached)" in lines[0]
    assert "  Run the same command again to continue from here." in lines
    assert not any(line.startswith("  far export") for line in lines)
    assert lines[-1] == "  the Prefect UI: http://h:4200 (its flow runs)"
    temporary = {"PREFECT_API_URL": "http://127.0.0.1:5/api", "PREFECT_UI_URL": ""}
    assert "prefect server start" in summary_lines(_summary(run_uri), environ=temporary)[-1]


def test_help_lists_the_commands_before_the_exit_codes() -> None:
    text = build_parser().format_help()
    assert text.index("    run ") < text.index("Exit codes:")
    assert text.index("    runs ") < text.index("Exit codes:")


def test_a_bundled_recipe_runs_by_name_and_a_typo_gets_a_suggestion(tmp_path: Path) -> None:
    assert resolve_recipe_uri("smoke") == storage.join(BUNDLED, "smoke.yaml")
    assert resolve_recipe_uri("smoke.yaml", BUNDLED).endswith("/recipes/smoke.yaml")
    assert resolve_recipe_uri("recipes/smok.yaml") == "recipes/smok.yaml"  # a path stays one
    (tmp_path / "mine.yaml").write_text("name: x\n")
    with pytest.raises(RecipeError, match=re.escape(f"did you mean {tmp_path}/mine.yaml?")):
        load_recipe(str(tmp_path / "mien.yaml"))
    with pytest.raises(RecipeError, match="did you mean the bundled recipe 'smoke'"):
        load_recipe(resolve_recipe_uri("smok"))
    with pytest.raises(RecipeError, match="`far recipes` lists the bundled recipes"):
        load_recipe(str(tmp_path / "nothing-like-it.yaml"))


def test_far_validate_takes_a_bundled_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "smoke", "--root", str(tmp_path)]) == 0
    assert "valid; run 'smoke'" in capsys.readouterr().out


def test_each_bundled_recipe_is_described_in_a_whole_sentence() -> None:
    for name, description in bundled_recipes().items():
        assert description[:1].isupper() and description.endswith("."), (name, description)
        assert not re.search(r"(session|issue) \d+", description), (name, description)
