"""Evaluation statistics (Wilson intervals, exact McNemar), few-shot examples from the SFT
split, and the training plot's panels: pure functions, table-driven."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.artifacts import ModelScores
from schemas.recipe import EvalConfig
from stages.core import stats
from stages.evaluate import fewshot, headroom, reports


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    [
        (0, 10, 0.0, 0.2775),  # a zero rate still has an upper bound
        (5, 10, 0.2366, 0.7634),
        (10, 10, 0.7225, 1.0),
        (15, 32, 0.3087, 0.6355),  # 0.469 on 32 prompts (the demo's SFT row)
        (0, 0, 0.0, 1.0),
    ],
)
def test_wilson_interval(successes: int, trials: int, low: float, high: float) -> None:
    assert stats.wilson_interval(successes, trials) == pytest.approx((low, high), abs=1e-4)


@pytest.mark.parametrize(
    ("only_first", "only_second", "p"),
    [
        (0, 0, 1.0),
        (0, 6, 2 / 64),  # six discordant prompts all one way
        (1, 5, 2 * 7 / 64),
        (3, 3, 1.0),
        (5, 1, 2 * 7 / 64),  # symmetric
        (0, 5, 2 / 32),  # five all one way is not enough at 0.05
    ],
)
def test_mcnemar_exact_p(only_first: int, only_second: int, p: float) -> None:
    assert stats.mcnemar_exact_p(only_first, only_second) == pytest.approx(p)


def test_paired_comparison_counts_only_discordant_prompts() -> None:
    sft = [1, 1, 0, 0, 1, 0, 0, 0]
    grpo = [1, 0, 1, 1, 1, 1, 0, 0]
    c = stats.paired_comparison("sft", sft, "grpo", grpo)
    assert (c.candidate_only, c.baseline_only, c.n) == (3, 1, 8)
    assert c.difference == pytest.approx(0.25) and c.p_value == pytest.approx(2 * 5 / 16)
    with pytest.raises(ValueError, match="same prompts: a has 2, b has 1"):
        stats.paired_comparison("a", [1, 0], "b", [1])


def test_with_statistics_adds_intervals_and_comparison_with_the_previous_model() -> None:
    samples = [
        {"model": m, "id": f"p{i}", "format": f, "correct": c}
        for m, outcomes, formats in (
            ("sft", [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]),
            ("grpo", [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]),
        )
        for i, (c, f) in enumerate(zip(outcomes, formats, strict=True))
    ]
    scores = [
        ModelScores(
            name=m,
            checkpoint_uri=None,
            num_prompts=6,
            format_rate=1.0,
            accuracy=a,
            mean_completion_chars=1.0,
        )
        for m, a in (("sft", 0.0), ("grpo", 1.0))
    ]
    sft, grpo = reports.with_statistics(scores, samples)
    assert "vs_previous/p_value" not in sft.metrics
    assert grpo.metrics["vs_previous/p_value"] == pytest.approx(2 / 64)
    assert grpo.metrics["accuracy_ci_low"] == pytest.approx(0.6097, abs=1e-4)
    metrics = reports.record_metrics([sft, grpo])
    assert metrics["grpo/vs_previous/only_this_right"] == 6 and "sft/accuracy_ci_high" in metrics
    table = reports.comparison_table([sft, grpo])
    assert "| grpo | sft | accuracy | +1.000 | 6 | 0 | 0.0312 |" in table
    # the format comparison is paired too: 4 prompts gained the format, 0 lost it
    assert grpo.metrics["vs_previous/format_p_value"] == pytest.approx(2 / 16)
    assert metrics["grpo/vs_previous/format_only_previous_right"] == 0
    assert "| grpo | sft | format | +0.667 | 4 | 0 | 0.125 |" in table


def test_worked_examples_come_from_segments_of_the_sft_split() -> None:
    # row 0 packs two examples (segments 1, 2), row 1 one example and padding
    arrays = {
        "input_tokens": np.asarray([[2, 10, 11, 20, 1, 2, 12, 21], [2, 13, 22, 23, 1, 0, 0, 0]]),
        "input_mask": np.asarray([[0, 0, 0, 1, 1, 0, 0, 1], [0, 0, 1, 1, 1, 0, 0, 0]]),
        "segment_ids": np.asarray([[1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 1, 0, 0, 0]]),
    }
    assert fewshot.worked_examples(arrays, 3) == [
        ([2, 10, 11], [20, 1]),
        ([2, 12], [21]),
        ([2, 13], [22, 23, 1]),
    ]
    with pytest.raises(ValueError, match="holds 3 examples, eval asks for 4 shots"):
        fewshot.worked_examples(arrays, 4)
    text = fewshot.shot_text(([2, 10], [20, 1]), lambda ids: "".join(map(chr, ids)), {1, 2})
    assert text == "\n\x14\n" and fewshot.few_shot_prompt(["a\n", "b\n"], "Q") == "a\nb\nQ"


def test_training_plot_puts_each_quantity_in_its_own_panel() -> None:
    histories = {
        "sft": {"loss": [3.0, 2.0], "learning_rate": [1e-3, 1e-3]},
        "grpo": {
            "rewards/mean": [0.2, 0.4],
            "rewards/min": [0.0, 0.1],
            "rewards/max": [0.5, 0.9],
            "rewards/sum": [0.2, 0.4],
            "rewards/format_strict": [0.1, 0.2],
            "rewards/answer_match": [0.1, 0.2],
            "kl": [0.0, 0.01],
            "far/zero_variance_groups": [1.0, 0.5],
            "completions/mean_length": [10.0, 12.0],
            "global_step": [0.0, 1.0],
        },
    }
    titles = {title: series for title, series, _ in reports.training_panels(histories)}
    assert titles["grpo: each reward's mean"] == [
        "grpo:rewards/answer_match",
        "grpo:rewards/format_strict",
    ]
    assert titles["grpo: KL to the reference"] == ["grpo:kl"]
    assert len(titles) == 7 and not any("global_step" in s for v in titles.values() for s in v)
    assert reports.training_plot(histories).startswith(b"\x89PNG")
    assert reports.training_plot({}).startswith(b"\x89PNG")


# (samples n, correct c, k) -> unbiased pass@k, 1 - C(n-c, k) / C(n, k)
PASS_AT_K = [
    (8, 0, 1, 0.0),
    (8, 8, 8, 1.0),
    (8, 2, 1, 0.25),  # pass@1 is the mean over samples
    (8, 2, 2, 1 - 15 / 28),  # C(6,2)=15, C(8,2)=28
    (8, 2, 8, 1.0),  # at k = n: solved at least once
    (4, 1, 4, 1.0),
    (4, 3, 2, 1.0),  # n - c < k: every pair holds a right one
]


@pytest.mark.parametrize(("n", "c", "k", "expected"), PASS_AT_K)
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int, expected: float) -> None:
    assert stats.pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_refuses_a_k_beyond_the_samples() -> None:
    with pytest.raises(ValueError, match=r"1 <= k <= samples \(4\), got k=8"):
        stats.pass_at_k(4, 1, 8)
    assert stats.pass_at_ks(8) == [1, 2, 4, 8]
    assert stats.pass_at_ks(6) == [1, 2, 4, 6]
    assert stats.informative_group_chance(0.5, 4) == pytest.approx(1 - 2 / 16)
    assert stats.informative_group_chance(0.0, 8) == 0.0


def test_headroom_metrics_and_table() -> None:
    # 4 prompts x 4 samples: never, once, three times, always solved
    per_prompt = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 1], [1, 1, 1, 1]])
    m = headroom.headroom_metrics(per_prompt)
    assert m["pass@1"] == pytest.approx(8 / 16)
    assert m["pass@4"] == pytest.approx(3 / 4)
    assert m["pass@2"] == pytest.approx((0 + 0.5 + 1 + 1) / 4)  # once of 4: 1 - C(3,2)/C(4,2)
    assert [m[headroom.histogram_key(c, 4)] for c in range(5)] == [1, 1, 0, 1, 1]
    assert (m["solved_never"], m["solved_sometimes"], m["solved_always"]) == (0.25, 0.5, 0.25)
    table = headroom.headroom_table([("sft", 4, {**m, "majority_accuracy": 0.5}, 0.25)])
    assert "| sft | 4 | 0.250 | 0.500 | 0.625 | 0.750 | 0.500 | 0.250 | 0.500 | 0.250 |" in table
    assert "| sft | 1 | 1 | 0 | 1 | 1 |" in table
    with pytest.raises(ValueError, match="at least 2 samples"):
        headroom.headroom_metrics(np.ones((3, 1)))


def test_report_shows_headroom_of_sampled_models_beside_their_greedy_row() -> None:
    sampled = ModelScores(
        name="sft",
        checkpoint_uri=None,
        num_prompts=2,
        format_rate=1.0,
        accuracy=0.5,
        mean_completion_chars=10.0,
        metrics={"samples": 2.0, **headroom.headroom_metrics(np.array([[1, 0], [0, 0]]))},
    )
    greedy = sampled.model_copy(update={"name": "sft@greedy", "accuracy": 0.0, "metrics": {}})
    section = reports.headroom_section([sampled, greedy])
    assert "## Headroom" in section and "| sft | 2 | 0.000 | 0.250 | 0.500 |" in section
    assert reports.headroom_section([greedy]) == ""


def test_greedy_rows_need_a_sampled_evaluation() -> None:
    with pytest.raises(ValueError, match="needs samples >= 2"):
        EvalConfig(greedy=True)
    EvalConfig(greedy=True, samples=4, temperature=1.0)


def test_sign_flip_p_matches_the_exact_sign_test_on_equal_differences() -> None:
    # six equal differences all one way: exactly 2 of the 64 sign patterns are as extreme
    assert stats.sign_flip_p(np.ones(6)) == pytest.approx(2 / 64, abs=0.003)
    assert stats.sign_flip_p(np.array([1.0] * 5 + [-1.0])) == pytest.approx(14 / 64, abs=0.005)
    assert stats.sign_flip_p(np.zeros(5)) == 1.0  # no prompt moved: no evidence
    assert stats.sign_flip_p(np.ones(6)) == stats.sign_flip_p(np.ones(6))  # seeded


def test_paired_rates_use_every_sample_of_a_prompt() -> None:
    # 40 prompts x 4 samples: the candidate solves one more sample on 30 prompts, one fewer
    # on 2; its first samples are the same as the baseline's, so McNemar would see nothing
    base = np.zeros((40, 4))
    cand = np.zeros((40, 4))
    cand[:30, 1] = 1
    base[30:32, 2] = 1
    paired = stats.paired_rates(base, cand)
    assert (paired.prompts_up, paired.prompts_down, paired.n) == (30, 2, 40)
    assert paired.difference == pytest.approx((30 - 2) / 160)
    assert paired.ci_low > 0 and paired.p_value < 1e-4
    with pytest.raises(ValueError, match="the baseline has 40, the candidate 3"):
        stats.paired_rates(base, cand[:3])


def _rows(model: str, outcomes: list[list[int]]) -> list[dict[str, object]]:
    return [
        {"model": model, "id": f"p{i}", "format": 1.0, "correct": float(c)}
        for i, row in enumerate(outcomes)
        for c in row
    ]


def _scores(name: str, samples: int, outcomes: list[list[int]]) -> ModelScores:
    return ModelScores(
        name=name,
        checkpoint_uri=None,
        num_prompts=len(outcomes),
        format_rate=1.0,
        accuracy=float(np.mean(outcomes)),
        mean_completion_chars=1.0,
        metrics={"samples": float(samples)},
    )


def test_sampled_rows_are_compared_with_sampled_rows_and_greedy_with_greedy() -> None:
    # rows in the order the stage writes them: sft, sft@greedy, grpo, grpo@greedy
    sft = [[1, 0, 0, 0]] * 12 + [[0, 0, 0, 0]] * 12
    grpo = [[1, 1, 1, 0]] * 12 + [[0, 1, 0, 0]] * 12  # same first samples, more right later
    sft_greedy, grpo_greedy = [[1]] * 12 + [[0]] * 12, [[1]] * 24
    given = [
        ("sft", 4, sft),
        ("sft@greedy", 1, sft_greedy),
        ("grpo", 4, grpo),
        ("grpo@greedy", 1, grpo_greedy),
    ]
    samples = [r for name, _, outcomes in given for r in _rows(name, outcomes)]
    rows = reports.with_statistics([_scores(*g) for g in given], samples)
    by_name = {s.name: s for s in rows}
    assert [None if b is None else b.name for b in reports.previous_rows(rows)] == [
        None,
        None,
        "sft",
        "sft@greedy",
    ]
    sampled, greedy = by_name["grpo"].metrics, by_name["grpo@greedy"].metrics
    assert sampled["vs_previous/only_this_right"] == 0  # first samples: no change
    assert sampled["vs_previous/pass@1_difference"] == pytest.approx(0.5 - 0.125)
    assert sampled["vs_previous/pass@1_prompts_up"] == 24
    assert sampled["vs_previous/pass@1_p_value"] < 1e-4
    assert greedy["vs_previous/only_this_right"] == 12  # greedy against greedy
    assert "vs_previous/pass@1_p_value" not in greedy
    # the interval counts the 24 prompts (their means 0.75 and 0.25), not the 96 completions
    assert (sampled["accuracy_ci_low"], sampled["accuracy_ci_high"]) == pytest.approx(
        stats.wilson_interval(12 * 0.75 + 12 * 0.25, 24)
    )
    table = reports.comparison_table(rows)
    assert "| grpo | sft | pass@1 (4 samples) | +0.375 [+0.324, +0.426] | 24 | 0 |" in table
    assert "| grpo@greedy | sft@greedy | accuracy | +0.500 | 12 | 0 | 0.000488 |" in table


def test_a_reward_the_evaluation_scored_gets_a_column_of_its_means() -> None:
    """eval.rewards' means (`reward/<name>` metrics) show in the table a run prints, a
    column per reward; a model without one shows nan; no reward, no extra column."""
    sft, grpo = _scores("sft", 1, [[1], [0]]), _scores("grpo", 1, [[1], [1]])
    plain = reports.markdown_table([sft, grpo]).splitlines()
    assert plain[0].endswith("| mean completion chars |")
    grpo = grpo.model_copy(update={"metrics": {**grpo.metrics, "reward/plain_number": 0.75}})
    lines = reports.markdown_table([sft, grpo]).splitlines()
    assert lines[0].endswith("| mean completion chars | reward/plain_number |")
    assert lines[1].count("|") == plain[1].count("|") + 1
    assert lines[2].endswith("| 1.0 | nan |") and lines[3].endswith("| 1.0 | 0.750 |")


def test_holm_multiplies_the_ith_smallest_p_by_k_minus_i_and_keeps_the_order() -> None:
    """Four p-values by hand: 0.005 x 4, 0.01 x 3, 0.03 x 2 = 0.06, and 0.04 x 1 = 0.04
    raised to the 0.06 before it (an adjusted p never falls below a smaller raw p's)."""
    adjusted = stats.holm_adjusted({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005})
    assert adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06, "d": 0.02})
    assert stats.holm_adjusted({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}  # capped at 1
    assert stats.holm_adjusted({}) == {}


def test_holm_keeps_the_chance_of_any_false_pass_at_alpha_where_raw_p_does_not() -> None:
    """11 true nulls (uniform p-values), 20,000 families: raw p <= 0.05 passes at least one
    in about 1 - 0.95^11 = 0.43 of them; Holm-adjusted, in at most 0.05 (plus noise)."""
    rng = np.random.default_rng(0)
    families = rng.uniform(size=(20_000, 11))
    raw_any = float(np.mean((families <= 0.05).any(axis=1)))
    holm_any = float(
        np.mean(
            [
                min(stats.holm_adjusted({str(i): float(p) for i, p in enumerate(f)}).values())
                <= 0.05
                for f in families
            ]
        )
    )
    assert raw_any == pytest.approx(1 - 0.95**11, abs=0.01)
    assert holm_any <= 0.05 + 0.005
