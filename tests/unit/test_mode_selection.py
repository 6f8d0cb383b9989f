"""Issue 35's selection by the mode, preference pairs against the mode, and the pick between
policies, on evaluation rows shaped as samples.jsonl writes them (model label, prompt id,
completion, format, correct; a greedy row `<model>@greedy` beside the sampled ones)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from pipeline.dag import build_dag
from pipeline.recipes import RecipeError, load_recipe
from schemas.artifacts import (
    GREEDY_SUFFIX,
    CheckpointArtifact,
    DatasetArtifact,
    EvalReport,
    ModelScores,
)
from schemas.recipe import EvalConfig, HardSubsetConfig, PickConfig, PreferencesConfig
from schemas.record import StageRecord
from stages import hard_subset, pick, preferences
from stages.core.checkpoints import saved_steps
from stages.core.datasets import load_prompts, write_derived_dataset
from stages.core.errors import InputError, TamperedStage
from stages.core.records import located_output
from stages.evaluate import evaluation
from stages.registry import hashed_config

# prompt id -> (greedy right?, correct of each of 4 samples)
OUTCOMES: dict[str, tuple[bool, list[int]]] = {
    "p0": (False, [0, 1, 0, 0]),  # wrong mode, sometimes solved: kept
    "p1": (False, [0, 0, 0, 0]),  # wrong and never solved: no right answer to move toward
    "p2": (False, [1, 1, 1, 0]),  # wrong mode, mostly solved: kept
    "p3": (True, [1, 1, 1, 1]),  # right and always: the last greedy-right prompt to keep
    "p4": (True, [0, 1, 0, 0]),  # right but rarely sampled: the first greedy-right to keep
    "p5": (True, [1, 0, 1, 1]),
}


def samples(model: str = "sft") -> list[dict[str, Any]]:
    rows = []
    for prompt, (greedy_right, sampled) in OUTCOMES.items():
        rows.append(row(f"{model}@greedy", prompt, int(greedy_right), f"greedy {prompt}"))
        for i, correct in enumerate(sampled):
            rows.append(row(model, prompt, correct, f"sample {i} {prompt}", fmt=i % 2))
    return rows


def row(model: str, prompt: str, correct: int, completion: str, fmt: int = 1) -> dict[str, Any]:
    return {
        "model": model,
        "id": prompt,
        "domain": "math",
        "answer": "4",
        "completion": completion,
        "format": float(fmt),
        "exact": float(correct),
        "correct": float(correct),
    }


def test_the_mode_band_keeps_exactly_the_wrong_modes_that_samples_sometimes_solve() -> None:
    config = HardSubsetConfig(model="sft", select="mode")
    ids, scores, greedy_right = hard_subset.chosen_ids(samples(), config)
    assert ids == ["p0", "p2"]
    assert scores["p2"] == 0.75 and scores["p1"] == 0.0
    assert greedy_right == {p: right for p, (right, _) in OUTCOMES.items()}


def test_a_share_of_greedy_right_prompts_stays_least_sampled_first() -> None:
    config = HardSubsetConfig(model="sft", select="mode", right_share=0.5)
    ids, _, _ = hard_subset.chosen_ids(samples(), config)
    assert ids == ["p0", "p2", "p4", "p5"]  # 2 wrong-mode + 2 right, p4 (0.25) and p5 (0.75)


def test_the_mode_band_tops_up_to_min_prompts() -> None:
    config = HardSubsetConfig(model="sft", select="mode", min_prompts=3)
    ids, _, _ = hard_subset.chosen_ids(samples(), config)
    assert ids == ["p0", "p2", "p4"]


def test_the_mode_needs_a_greedy_row_and_a_mode_to_move() -> None:
    sampled_only = [r for r in samples() if not r["model"].endswith("@greedy")]
    with pytest.raises(InputError, match="greedy: true"):
        hard_subset.chosen_ids(sampled_only, HardSubsetConfig(model="sft", select="mode"))
    all_right = [r | {"correct": 1.0} if r["model"].endswith("@greedy") else r for r in samples()]
    with pytest.raises(InputError, match="no mode to move"):
        hard_subset.chosen_ids(all_right, HardSubsetConfig(model="sft", select="mode"))
    with pytest.raises(ValidationError, match="right_share"):
        HardSubsetConfig(model="sft", right_share=0.2)


def test_mode_pairs_reject_the_greedy_answer_for_a_right_sample_in_format() -> None:
    prompts = {p: f"question {p}" for p in OUTCOMES}
    pairs = preferences.mode_pairs(samples(), prompts, "sft")
    assert [p["group"] for p in pairs] == ["p0", "p2"]
    assert all(p["rejected"] == f"greedy {p['group']}" for p in pairs)
    # p0: the only right sample (1, format 0); p2: the first right one in format (sample 1)
    assert [p["chosen"] for p in pairs] == ["sample 1 p0", "sample 1 p2"]
    assert pairs[0]["prompt"] == "question p0"


def test_mode_pairing_names_its_model_and_reads_no_file() -> None:
    with pytest.raises(ValidationError, match="needs `model`"):
        PreferencesConfig(pairing="mode")
    with pytest.raises(ValidationError, match="no `file`"):
        PreferencesConfig(pairing="mode", model="sft", file="pairs.jsonl")


@pytest.mark.parametrize(
    ("accuracy", "min_gain", "chosen"),
    [
        ({"sft": 0.5, "grpo": 0.4}, 0.0, "sft"),  # worse: never the output
        ({"sft": 0.5, "grpo": 0.5}, 0.0, "sft"),  # a tie keeps the incumbent
        ({"sft": 0.5, "grpo": 0.6}, 0.0, "grpo"),
        ({"sft": 0.5, "grpo": 0.6}, 0.1, "sft"),  # not by more than min_gain
        ({"sft": 0.5, "grpo": 0.6, "dpo": 0.6}, 0.0, "grpo"),  # a tie: the earlier listed
        ({"sft": 0.5, "grpo": 0.6, "dpo": 0.7}, 0.0, "dpo"),
    ],
)
def test_pick_keeps_the_incumbent_unless_beaten(
    accuracy: dict[str, float], min_gain: float, chosen: str
) -> None:
    assert pick.choose(accuracy, min_gain) == chosen


@pytest.mark.parametrize(
    ("p_values", "max_p", "chosen"),
    [
        ({"grpo": 0.82, "dpo": 0.03}, None, "grpo"),  # unset: the most accurate, any p
        ({"grpo": 0.82, "dpo": 0.03}, 0.05, "dpo"),  # grpo's gain is noise: the next best
        ({"grpo": 0.82, "dpo": 0.30}, 0.05, "sft"),  # every gain is noise: the incumbent
        ({"grpo": 0.05, "dpo": 0.03}, 0.05, "grpo"),  # p == max_p passes
    ],
)
def test_max_p_keeps_a_gain_inside_the_noise_out(
    p_values: dict[str, float], max_p: float | None, chosen: str
) -> None:
    accuracy = {"sft": 0.50, "grpo": 0.60, "dpo": 0.55}
    assert pick.choose(accuracy, 0.0, p_values, max_p) == chosen


def test_choice_rows_carry_the_exact_mcnemar_p_of_their_wins_and_losses() -> None:
    """Seed 1 of reinforce-mode: orpo@step20 won 11 and lost 9 of 256 validation prompts
    against sft (+0.008); McNemar p = 0.82, so max_p 0.05 keeps sft."""
    incumbent = {f"q{i}": 1.0 if i < 161 else 0.0 for i in range(256)}
    arm = dict(incumbent)
    for i in range(9):  # lost: the incumbent right, the arm wrong
        arm[f"q{i}"] = 0.0
    for i in range(161, 172):  # won: the incumbent wrong, the arm right
        arm[f"q{i}"] = 1.0
    step20 = CheckpointArtifact.model_construct(uri="/r/o", step=20)
    row = pick._row("orpo@step20", step20, arm, incumbent)
    assert (row["wins_vs_incumbent"], row["losses_vs_incumbent"]) == (11, 9)
    assert row["p_vs_incumbent"] == pytest.approx(0.8238, abs=1e-4)
    accuracy = {"sft": sum(incumbent.values()) / 256, "orpo@step20": row["accuracy"]}
    assert accuracy["orpo@step20"] > accuracy["sft"]
    p_values = {"orpo@step20": row["p_vs_incumbent"]}
    assert pick.choose(accuracy, 0.0, p_values, 0.05) == "sft"
    assert pick.choose(accuracy, 0.0, p_values, None) == "orpo@step20"


def test_max_p_is_refused_outside_0_1_and_left_out_of_the_hash_when_unset() -> None:
    with pytest.raises(ValidationError, match="max_p"):
        PickConfig(candidates=["sft", "grpo"], max_p=0)
    plain = PickConfig(candidates=["sft", "grpo"])
    assert hashed_config("pick", plain) == hashed_config("pick", plain.model_copy())
    assert "max_p" not in hashed_config("pick", plain)
    assert (
        hashed_config("pick", PickConfig(candidates=["sft", "grpo"], max_p=0.05))["max_p"] == 0.05
    )


DAG = """
name: t
storage_root: /tmp/unused
model: {family: gemma3, source: random, tokenizer: bytes, dtype: float32,
        architecture: {num_layers: 1, num_embed: 272, embed_dim: 32, hidden_dim: 64,
                       num_heads: 2, head_dim: 16, num_kv_heads: 1}}
data:
  eval: {size: 4, sources: [&a {kind: reasoning_gym, name: basic_arithmetic, size: 64}]}
  VALIDATION
  grpo: {size: 4, sources: [*a]}
  sft: {size: 8, sources: [*a]}
sft: {max_steps: 2, batch_size: 2}
grpo: {max_steps: 1, batch_size: 2, num_generations: 2, rewards: {answer_match: 1.0}}
pipeline:
  - {id: data_prep, kind: data_prep}
  - {id: sft, kind: sft, inputs: {dataset: data_prep}}
  - {id: grpo, kind: grpo, inputs: {dataset: data_prep, policy: sft}}
  - {id: val, kind: evaluate, inputs: {dataset: data_prep, sft: sft, grpo: grpo},
     config: {models: [sft, grpo], split: SPLIT}}
  - {id: pick, kind: pick, inputs: {evaluation: val, sft: sft, grpo: INPUT},
     config: {candidates: [sft, grpo]}}
"""


def dag(tmp_path: Any, validation: bool = True, split: str = "validation", grpo: str = "grpo"):
    text = (
        DAG.replace("VALIDATION", "validation: {size: 4, sources: [*a]}" if validation else "")
        .replace("SPLIT", split)
        .replace("INPUT", grpo)
    )
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return build_dag(load_recipe(str(path), {}, ()))


def test_the_pick_dag_is_checked_before_compute(tmp_path: Any) -> None:
    assert [n.id for n in dag(tmp_path).nodes][-1] == "pick"
    with pytest.raises(RecipeError, match=r"split validation, got a data_prep .*data\.validation"):
        dag(tmp_path, validation=False)
    with pytest.raises(RecipeError, match="pick chooses on the validation split"):
        dag(tmp_path, split="grpo_train")
    with pytest.raises(RecipeError, match="must evaluate the same node"):
        dag(tmp_path, grpo="sft")


def test_a_picks_output_is_another_stage_of_its_run_and_moves_with_a_copy() -> None:
    """A pick record's output is the chosen stage's checkpoint, outside the pick's own
    directory but inside its run: followed, and mapped into a copied run; a path outside the
    run is refused."""

    def record(uri: str) -> StageRecord:
        output = CheckpointArtifact.model_construct(uri=uri)
        return StageRecord.model_construct(run="r", directory="pick-abc", output=output)

    written = "/old/runs/r/sft-123/checkpoints"
    moved = located_output("/new/place/r/pick-abc/stage.json", record(written))
    assert moved.uri == "/new/place/r/sft-123/checkpoints"
    with pytest.raises(TamperedStage, match="outside its run"):
        located_output("/new/place/r/pick-abc/stage.json", record("/elsewhere/ckpt"))


def test_the_mode_subset_is_written_with_its_selection(tmp_path: Any) -> None:
    """select: mode end to end on files: the kept prompts become grpo_train, the eval split is
    carried over, and selection.jsonl says per prompt its solve rate, whether greedy was right
    and whether it was kept."""
    prompts = [
        {"id": p, "prompt": f"q {p}", "answer": "4", "domain": "math", "source": "s", "tests": []}
        for p in OUTCOMES
    ]
    held_out = [dict(prompts[0], id="e0")]
    base = DatasetArtifact.model_construct(tokenizer="bytes", seq_len=64, prompt_len=32)
    dataset = write_derived_dataset(
        str(tmp_path / "data"), base, {"grpo_train": prompts, "eval": held_out}
    )
    samples_uri = tmp_path / "samples.jsonl"
    samples_uri.write_text("".join(json.dumps(r) + "\n" for r in samples()))
    evaluation = EvalReport.model_construct(samples_uri=str(samples_uri))
    config = HardSubsetConfig(model="sft", select="mode", right_share=0.5)
    out, metrics, _ = hard_subset._select(str(tmp_path / "hard"), evaluation, dataset, config)
    assert [r["id"] for r in load_prompts(out, "grpo_train")] == ["p0", "p2", "p4", "p5"]
    assert [r["id"] for r in load_prompts(out, "eval")] == ["e0"]
    assert metrics["prompts_greedy_wrong_kept"] == 2 and metrics["prompts_kept"] == 4
    selection = {
        r["id"]: r
        for r in map(json.loads, (tmp_path / "hard" / "selection.jsonl").read_text().splitlines())
    }
    assert selection["p1"] == {"id": "p1", "score": 0.0, "kept": False, "greedy_correct": False}
    assert selection["p4"]["kept"] and selection["p4"]["greedy_correct"]


def test_saved_steps_are_the_numbered_directories_only(tmp_path: Any) -> None:
    for name in ("10/a", "30/a", "20/b", "40.orbax-checkpoint-tmp-17/a", "logs/x"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert saved_steps(str(tmp_path)) == [10, 20, 30]  # an unfinished save is not a step


def test_steps_saved_scores_every_earlier_step_before_the_committed_one(tmp_path: Any) -> None:
    for step in (2, 4, 6):
        (tmp_path / "grpo" / str(step)).mkdir(parents=True)
        (tmp_path / "grpo" / str(step) / "w").write_text("x")
    grpo = CheckpointArtifact.model_construct(uri=str(tmp_path / "grpo"), step=6)
    last = EvalConfig(models=["base", "grpo"])
    assert evaluation.with_saved_steps(last, {"grpo": grpo}) == (last, {"grpo": grpo})
    config, checkpoints = evaluation.with_saved_steps(
        last.model_copy(update={"steps": "saved"}), {"grpo": grpo}, grid=lambda _: 2
    )
    assert config.models == ["base", "grpo@step2", "grpo@step4", "grpo"]
    assert {n: (a.uri, a.step) for n, a in checkpoints.items()} == {
        "grpo@step2": (grpo.uri, 2),
        "grpo@step4": (grpo.uri, 4),
        "grpo": (grpo.uri, 6),
    }


def test_steps_saved_leaves_out_saves_off_the_stages_grid(tmp_path: Any) -> None:
    """A GRPO arm saved step 1 (Orbax's first save) and step 7 (its session stopped there)
    besides its 12-step grid: only 12 is a candidate, as for an arm whose sessions never
    stopped; a stage that also saved on a clock (grid None) has every save scored."""
    for step in (1, 7, 12, 24):
        (tmp_path / "grpo" / str(step)).mkdir(parents=True)
        (tmp_path / "grpo" / str(step) / "w").write_text("x")
    grpo = CheckpointArtifact.model_construct(uri=str(tmp_path / "grpo"), step=24)
    saved = EvalConfig(models=["grpo"], steps="saved")
    on_grid, _ = evaluation.with_saved_steps(saved, {"grpo": grpo}, grid=lambda _: 12)
    assert on_grid.models == ["grpo@step12", "grpo"]
    clocked, _ = evaluation.with_saved_steps(saved, {"grpo": grpo}, grid=lambda _: None)
    assert clocked.models == ["grpo@step1", "grpo@step7", "grpo@step12", "grpo"]


def test_pick_chooses_among_every_scored_step_of_the_arms_not_the_incumbents() -> None:
    """Each candidate but the incumbent adds the earlier steps the evaluation scored (greedy
    rows beside samples: `@step<N>@greedy`); the output is the best step, at that step."""
    names = ["sft@step5", "sft", "grpo@step2", "grpo@step4", "grpo", "dpo"]
    report = EvalReport.model_construct(
        scores=[ModelScores.model_construct(name=n + GREEDY_SUFFIX) for n in names]
    )
    arts = {
        n: CheckpointArtifact.model_construct(uri=f"/r/{n}", step=s)
        for n, s in (("sft", 10), ("grpo", 6), ("dpo", 3))
    }
    labels = {n: n + GREEDY_SUFFIX for n in arts}
    choice_labels, choices = pick.saved_step_choices(report, labels, arts)
    assert list(choice_labels) == ["sft", "grpo", "grpo@step4", "grpo@step2", "dpo"]
    assert choice_labels["grpo@step4"] == "grpo@step4@greedy"
    assert (choices["grpo@step4"].uri, choices["grpo@step4"].step) == ("/r/grpo", 4)
    assert choices["grpo"] is arts["grpo"]
    accuracy = dict.fromkeys(choice_labels, 0.5) | {"grpo@step4": 0.7, "grpo@step2": 0.7}
    assert pick.choose(accuracy, 0.0) == "grpo@step4"  # the peak; a tie: the newer step


def test_a_model_with_an_earlier_models_checkpoint_and_step_is_a_copy() -> None:
    """reinforce-mode's `chosen` is the pick's output, one of the arms at one of its steps:
    the same URI and step as an earlier row is decoded once; another step is another model."""
    grpo = CheckpointArtifact.model_construct(uri="/r/grpo", step=20)
    checkpoints = {
        "sft": CheckpointArtifact.model_construct(uri="/r/sft", step=640),
        "grpo": grpo,
        "grpo_step10": grpo.model_copy(update={"step": 10}),
        "chosen": grpo.model_copy(),
        "again": CheckpointArtifact.model_construct(uri="/r/sft", step=640),
    }
    names = ["base", "sft", "grpo", "grpo_step10", "chosen", "again"]
    copies = evaluation.same_checkpoint_as(names, checkpoints)
    assert copies == {"chosen": "grpo", "again": "sft"}
    # the progress bar counts the batches decoded: 4 models (base twice: its k-shot row) of
    # 10 prompts at 4 a batch; the copies decode none
    config = EvalConfig(models=names, batch_size=4)
    assert evaluation.batches_to_decode(config, 10, copies) == 5 * 3


def test_holm_keeps_out_a_choice_that_passes_max_p_only_on_its_own() -> None:
    """11 choices against the incumbent: p 0.03 passes max_p 0.05 alone, but Holm-adjusted
    over the 11 it is 0.33; p 0.002 (0.022 adjusted) still passes. choice.json then names
    the adjusted value as `p_holm` beside the raw one."""
    arms = [f"arm{i}" for i in range(11)]
    rows = [{"name": "sft", "p_vs_incumbent": 1.0}] + [
        {"name": n, "p_vs_incumbent": 0.9} for n in arms
    ]
    rows[1]["p_vs_incumbent"] = 0.03
    accuracy = {"sft": 0.5, **dict.fromkeys(arms, 0.45), "arm0": 0.6}
    assert pick.choose(accuracy, 0.0, pick.tested_p_values(rows, "sft", "none"), 0.05) == "arm0"
    adjusted = pick.tested_p_values(rows, "sft", "holm")
    assert adjusted["arm0"] == pytest.approx(0.33)
    assert adjusted["sft"] == 1.0 and adjusted["arm5"] == 1.0
    assert pick.choose(accuracy, 0.0, adjusted, 0.05) == "sft"
    rows[1]["p_vs_incumbent"] = 0.002
    adjusted = pick.tested_p_values(rows, "sft", "holm")
    assert adjusted["arm0"] == pytest.approx(0.022)
    assert pick.choose(accuracy, 0.0, adjusted, 0.05) == "arm0"


def test_a_correction_needs_max_p_and_is_left_out_of_the_hash_when_none() -> None:
    with pytest.raises(ValidationError, match="correction 'holm' adjusts p-values against max_p"):
        PickConfig(candidates=["sft", "grpo"], correction="holm")
    with pytest.raises(ValidationError, match="correction"):
        PickConfig(candidates=["sft", "grpo"], max_p=0.05, correction="bonferroni")  # type: ignore[arg-type]
    plain = PickConfig(candidates=["sft", "grpo"], max_p=0.05)
    assert "correction" not in hashed_config("pick", plain)
    holm = PickConfig(candidates=["sft", "grpo"], max_p=0.05, correction="holm")
    assert hashed_config("pick", holm)["correction"] == "holm"
