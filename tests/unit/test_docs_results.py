"""The numbers docs/results.md and docs/getting-started.md quote for the smoke and demo runs
and the control experiments are the ones in docs/results/ and bench/results/: smoke.json is
written by bench/docs_results.py from a real run, demo.json holds the fresh-clone demo
measurement. Before, two documents quoted different runs (smoke flow 24.4 s against 46.1 s,
demo 285 s against 355 s). README.md's own table: tests/unit/test_readme.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench import reinforce_generalize, reinforce_mode
from tests.conftest import REPO

RESULTS_PAGE = REPO / "docs" / "results.md"
GETTING_STARTED = REPO / "docs" / "getting-started.md"
# the sentences as the documents word them; a line break may fall at any space
SMOKE_SENTENCE = re.compile(
    r"data-prep ([\d.]+) s, SFT ([\d.]+) s, GRPO ([\d.]+) s, evaluation ([\d.]+) s; "
    r"flow ([\d.]+) s, orchestration ([\d.]+) s".replace(" ", r"\s+")
)
DEMO_SENTENCE = re.compile(
    r"flow (\d+) s; SFT (\d+) s, GRPO (\d+) s, evaluation (\d+) s; SFT ([\d.]+), "
    r"GRPO ([\d.]+)".replace(" ", r"\s+")
)


def results(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPO / "docs" / "results" / f"{name}.json").read_text())
    return data


def test_getting_started_prints_the_smoke_run_of_the_results_file() -> None:
    smoke = results("smoke")
    assert smoke["excerpt"] in GETTING_STARTED.read_text(), (
        "docs/getting-started.md's smoke excerpt is not the one in docs/results/smoke.json: "
        "paste its `excerpt` (regenerate with bench/docs_results.py)"
    )


def smoke_numbers(text: str, where: str) -> list[str]:
    sentences = SMOKE_SENTENCE.findall(text)
    assert len(sentences) == 1, f"{where}: expected one smoke timing sentence, got {sentences}"
    return list(sentences[0])


def expected_smoke_numbers() -> list[str]:
    smoke = results("smoke")
    seconds = smoke["stage_seconds"]
    values = [seconds[s] for s in ("data_prep", "sft", "grpo", "evaluate")]
    values += [smoke["flow_seconds"], smoke["orchestration_seconds"]]
    return [f"{v:.1f}" for v in values]


def test_getting_started_quotes_the_smoke_run_of_the_results_file() -> None:
    quoted = smoke_numbers(GETTING_STARTED.read_text(), "docs/getting-started.md")
    assert quoted == expected_smoke_numbers()


def test_getting_started_quotes_the_smoke_scores_of_the_results_file() -> None:
    scores = results("smoke")["scores"]
    text = GETTING_STARTED.read_text()
    for model in ("base", "sft", "grpo"):
        row = f"| {model} | {scores[model]['format_rate']:.2f} | {scores[model]['accuracy']:.2f} |"
        assert row in text, f"docs/getting-started.md lacks the smoke row {row}"


@pytest.mark.parametrize("doc", [RESULTS_PAGE, GETTING_STARTED], ids=lambda p: p.name)
def test_both_documents_quote_the_demo_run_of_the_results_file(doc: Any) -> None:
    demo = results("demo")
    sentences = DEMO_SENTENCE.findall(doc.read_text())
    assert len(sentences) == 1, f"{doc.name}: expected one demo timing sentence, got {sentences}"
    seconds = demo["stage_seconds"]
    expected = [
        f"{demo['flow_seconds']:.0f}",
        *(f"{seconds[s]:.0f}" for s in ("sft", "grpo", "evaluate")),
        f"{demo['accuracy']['sft']:.3f}",
        f"{demo['accuracy']['grpo']:.3f}",
    ]
    assert list(sentences[0]) == expected


def test_a_changed_number_is_caught() -> None:
    """The check itself: the sentence parser reads the numbers a careless edit would change."""
    good = (
        "data-prep 1.0 s, SFT 12.0 s, GRPO 4.2 s, evaluation 4.3 s;\n"
        "flow 24.4 s, orchestration 2.9 s"
    )
    assert smoke_numbers(good, "x") == ["1.0", "12.0", "4.2", "4.3", "24.4", "2.9"]
    assert smoke_numbers(good.replace("12.0", "13.0"), "x") != smoke_numbers(good, "x")
    with pytest.raises(AssertionError):
        smoke_numbers(good + "\n" + good, "x")  # two sentences: which one is true?


def test_results_page_quotes_the_sft_sweep_of_its_results_file() -> None:
    """The plateau sweep's accuracies docs/results.md quotes (3e-4 at 160, 320 and 640 steps)
    are those in docs/results/sft-sweep.json (written by bench/sft_sweep.py from its runs)."""
    points = {(p["learning_rate"], p["steps"]): p for p in results("sft-sweep")["points"]}
    text = " ".join(RESULTS_PAGE.read_text().split())
    for steps in (160, 320, 640):
        quoted = f"{points[(0.0003, steps)]['greedy_accuracy']:.3f} after {steps}"
        assert quoted in text, f"docs/results.md should quote {quoted!r} from sft-sweep.json"


THREE_SEEDS = "reinforce-mode-three-seeds"


def test_results_page_shows_the_reinforce_mode_tables_of_its_results_file() -> None:
    """The control experiments as docs/results.md shows them: every line of the greedy and the
    sampled tables is the one bench/reinforce_mode.py builds from
    docs/results/reinforce-mode-three-seeds.json (the three data seeds' runs with the
    `sampled` node), and the sentences around them quote
    the same file: the lowest strict format rate, the mode pools' sizes, the pick's output,
    the answer signs of seed 1 and the minutes of each run's stages."""
    runs = results(THREE_SEEDS)["runs"]
    assert sorted(run["data_seed"] for run in runs) == [0, 1, 2]
    text = RESULTS_PAGE.read_text()
    for line in [
        *reinforce_mode.readme_table(runs).splitlines(),
        *reinforce_mode.readme_sampled_table(runs).splitlines(),
    ]:
        assert line in text, f"docs/results.md should show {line!r} from {THREE_SEEDS}.json"
    flat = " ".join(text.split())
    lowest = min(r["format_rate"] for run in runs for r in run["held_out"])
    assert f"strict format >= {lowest:.3f} in every row" in flat
    kept = [run["mode_prompts"]["prompts_kept"] for run in runs]
    wrong = [run["mode_prompts"]["prompts_greedy_wrong_kept"] for run in runs]
    assert f"pool of {min(kept):.0f} to {max(kept):.0f} prompts ({min(wrong):.0f} to " in flat
    assert {run["pick"]["chosen"] for run in runs} == {"sft"}
    assert {run["pick"]["chosen_at_max_p_0.05_holm"] for run in runs} == {"sft"}
    seed1 = next(run for run in runs if run["data_seed"] == 1)
    signs = seed1["answer_signs"]
    grpo, gold = signs["held_out_answers_negative"]["grpo"], signs["held_out_gold_negative"]
    assert f"GRPO answers negative {grpo:.3f} of the time, gold {gold:.3f}" in flat
    minutes = [str(round(run["total_seconds"] / 60)) for run in runs]
    assert f"{', '.join(minutes[:-1])} and {minutes[-1]} minutes" in flat
    seed0 = next(run for run in runs if run["data_seed"] == 0)

    def held_out(run: dict[str, Any], model: str, key: str = "held_out") -> dict[str, Any]:
        return next(r for r in run[key] if r["model"] == model)["vs_control"]

    closest = held_out(seed1, "self")["difference"], held_out(seed1, "self", "sampled")
    assert f"(greedy {closest[0]:+.3f}, sampled {closest[1]['difference']:+.3f}: noise)" in flat
    assert closest[1]["p_value"] > 0.05
    worst = held_out(seed0, "self")
    p = f"{worst['p_value']:.1e}".replace("e-0", "e-")
    assert f"self-teach on seed 0 ({worst['difference']:+.3f}, p {p})" in flat
    steps = seed0["pick"]["validation"]
    trail = ", ".join(f"{steps[k]:.3f}" for k in ("self@step0", "self@step20", "self"))
    assert f"self-teach: {trail} at steps 0, 20, 40" in flat
    first = next(r for r in results("reinforce-mode")["runs"] if r["data_seed"] == 0)
    assert f"(GRPO, {held_out(first, 'grpo')['difference']:+.3f} on seed 0)" in flat


GENERALIZE = "reinforce-generalize"
GENERALIZE_MODELS = {"control", "sft", "self", "orpo", "grpo", "random", "chosen", "control_wall"}


def test_results_page_shows_the_reinforce_generalize_tables_of_its_results_file() -> None:
    """recipes/reinforce-generalize.yaml's results as docs/results.md shows them: every line
    of the tables bench/reinforce_generalize.py builds from
    docs/results/reinforce-generalize.json, whose greedy rows are its own per-prompt outcomes
    (each arm's accuracy and its McNemar test against the control recomputed from them), at
    least 1,000 prompts at k+2 for every arm, and the sentences around the tables quote
    the same file."""
    runs = results(GENERALIZE)["runs"]
    assert runs, f"{GENERALIZE}.json holds no run"
    text = RESULTS_PAGE.read_text()
    for line in reinforce_generalize.page(runs).splitlines():
        assert line in text, f"docs/results.md should show {line!r} from {GENERALIZE}.json"
    for run in runs:
        assert len(run["per_prompt"]["k2"]["ids"]) >= 1000
        for level in reinforce_generalize.LEVELS:
            outcomes = reinforce_generalize.outcomes_by_id(run["per_prompt"][level])
            assert set(outcomes) == GENERALIZE_MODELS, (run["run"], level)
            for row in run["levels"][level]:
                mine = outcomes[row["model"]]
                assert row["prompts"] == len(mine)
                assert row["greedy_accuracy"] == round(sum(mine.values()) / len(mine), 4)
                paired = reinforce_mode.compare(outcomes["control"], mine, ("c", row["model"]))
                assert row["vs_control"] == paired, (run["run"], level, row["model"])
    flat = " ".join(text.split())
    for run in runs:
        pool = run["pool"]
        kept = f"{pool['prompts_kept']:.0f} of the {pool['prompts_evaluated']:.0f} level-4"
        assert kept in flat, f"docs/results.md should quote the pool: {kept!r}"
        for arm, speed in run["grpo_throughput"].items():
            quoted = f"{arm} {speed['completions_per_s']:.2f} completions/s"
            assert quoted in flat, f"docs/results.md should quote {quoted!r}"


def test_the_generalize_page_puts_seeds_side_by_side_and_names_a_level_not_measured_yet() -> None:
    """Two seeds' runs make one table a level, the second seed's columns after the first's; an
    interim run whose k1 node has not committed still gets its other tables, and the page
    names the run k1 is missing from (before, it raised KeyError)."""
    first = results(GENERALIZE)["runs"][0]
    second = {**first, "run": "reinforce-generalize-d2", "data_seed": 2}
    interim = {**second, "levels": {k: v for k, v in second["levels"].items() if k != "k1"}}
    both = reinforce_generalize.page([first, second])
    assert f"| model | seed {first['data_seed']}: greedy [95% CI] |" in both
    assert "| seed 2: greedy [95% CI] |" in both
    partial = reinforce_generalize.page([first, interim])
    assert "not measured yet in reinforce-generalize-d2" in partial
    assert partial.count("| seed 2: greedy [95% CI] |") == len(reinforce_generalize.LEVELS) - 1


SPEED_DIR = REPO / "bench" / "results"
# the page's table
SPEED_RESULTS = SPEED_DIR / "roofline-reinforce-headroom-40-steps-skip-flat.json"
SPEED_REPEATS = (  # the comparison with the earlier settings (docs/log.md)
    SPEED_DIR / "roofline-reinforce-headroom-40-steps.json",
)


def speed_ratio(path: Path) -> tuple[str, str]:
    """A roofline file's GRPO completions/s ratio as docs/results.md quotes it: "2.13x" and
    "(2.16, 2.10)", the median and each pair's."""
    ratio = json.loads(path.read_text())["ratios"]["grpo_completions_per_s"]
    return f"{ratio['median']:.2f}x", f"({', '.join(f'{p:.2f}' for p in ratio['pairs'])})"


def informative(runs: list[dict[str, Any]], update: bool) -> str:
    """The informative-group share over a roofline file's runs (steps 1 on): of the groups
    sampled, or (`update`) of the groups the actor update runs over with skip_flat_groups
    (bench/grpo_phases.update_informative, the stage's power-of-two fill)."""
    shares = []
    for run in runs:
        groups = run["grpo"]["batch_size"]
        for fraction in run["grpo_metrics"]["far/informative_groups"][1:]:
            if update and run["grpo"].get("skip_flat_groups"):  # informative ones, filled to 2^k
                kept = min(groups, 1 << max(0, round(fraction * groups) - 1).bit_length())
                fraction = round(fraction * groups) / kept
            shares.append(fraction)
    return f"{sum(shares) / len(shares):.2f}"


def test_results_page_quotes_the_grpo_speed_of_its_roofline_file() -> None:
    """GRPO's speed before and after (bench/roofline.py against the code before the opt-in
    grpo settings, this tree with them) as docs/results.md shows them: the ratio of
    each run of the comparison, the settings, what the bfloat16 vocabulary table moves
    (experiments/vocab_table_divergence.py), the informative-group shares and the table's seconds
    and completions per second."""
    run = json.loads(SPEED_RESULTS.read_text())
    now, before = run["current"], run["baseline"]

    def mean(runs: list[dict[str, Any]], phase: str) -> str:
        return f"{sum(r['seconds'][phase] for r in runs) / len(runs):.2f}"

    def rollout(runs: list[dict[str, Any]]) -> str:
        return " + ".join(mean(runs, p) for p in ("rollout_prefill", "rollout_decode", "rollout"))

    def rates(runs: list[dict[str, Any]]) -> str:
        return " / ".join(f"{r['grpo_completions_per_s']:.2f}" for r in runs)

    divergence = json.loads((SPEED_DIR / "vocab-table-divergence.json").read_text())
    changes = now[0]["grpo_changes"]
    settings = ", ".join(f"`{k}: {str(v).lower()}`" for k, v in changes.items())
    flat = " ".join(RESULTS_PAGE.read_text().split())
    median, pairs = speed_ratio(SPEED_RESULTS)
    for quoted in (
        f"**GRPO completions/s {median}** {pairs}",
        *(" ".join(speed_ratio(path)) for path in SPEED_REPEATS),
        f"this tree's GRPO at {settings}",
        f"distribution by {divergence['tv_mean']:.3f} in total variation on average",
        f"Informative groups: {informative(now, False)} of those sampled, "
        f"{informative(now, True)} of those the update runs over (0494bc9: "
        f"{informative(before, False)},",
    ):
        assert quoted in flat, f"docs/results.md should quote {quoted!r} from {SPEED_RESULTS.name}"
    performance = (REPO / "docs" / "performance.md").read_text()
    for row in (
        f"| actor update | {mean(before, 'actor_update')} | {mean(now, 'actor_update')} |",
        f"| rollout: prefill + decode + host | {rollout(before)} | {rollout(now)} |",
        f"| **completions/s, pair 1 / pair 2** | {rates(before)} | {rates(now)} |",
    ):
        assert row in performance, f"performance.md should show {row!r} from {SPEED_RESULTS.name}"


def test_results_page_quotes_the_oversampled_run_of_its_roofline_file() -> None:
    """grpo.oversample 2 with the four settings, against this tree without settings (one
    pair): the update's informative share, both completion ratios and the update's seconds as
    docs/results.md quotes them."""
    path = SPEED_DIR / "roofline-reinforce-headroom-40-steps-oversample.json"
    run = json.loads(path.read_text())
    (now,) = run["current"]
    assert now["grpo_changes"]["oversample"] == 2 and not run["baseline"][0]["grpo_changes"]
    ratios = run["ratios"]
    quoted = (
        f"the update's groups {now['update_informative']:.2f} informative, completions rolled "
        f"out {ratios['grpo_completions_per_s']['median']:.2f}x, trained "
        f"{ratios['grpo_trained_completions_per_s']['median']:.2f}x; its 4-group update took "
        f"{now['seconds']['actor_update']:.1f} s a step"
    )
    assert quoted in " ".join(RESULTS_PAGE.read_text().split()), quoted


def test_a_later_seed_joins_the_earlier_file_runs_unchanged_and_is_never_counted_twice() -> None:
    """A later seed's results file starts with the committed file's runs as they are (their
    run directories may be gone), and a seed already there is refused, not doubled."""
    first = results(GENERALIZE)["runs"]
    second = {**first[0], "run": "reinforce-generalize-d2", "data_seed": 2}
    assert reinforce_generalize.combine(first, [second]) == [*first, second]
    with pytest.raises(SystemExit, match="data seed 1 is in the earlier file already"):
        reinforce_generalize.combine(first, [{**second, "data_seed": 1}])
