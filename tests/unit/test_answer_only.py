"""Answer-only data (prompt + answer, or a plain user -> assistant chat) trains on the answer:
no reasoning is invented; the dataset is written in the answer format (`<answer>A</answer>`),
which the format rewards and evaluation grade as the format; a filler is opt-in; rows with
and without reasoning mixed are refused naming the fix; only the data_prep identity of
recipes whose sft sources give rows without reasoning moves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.recipe import PromptFormat
from stages import rewards
from stages.core.datasets import load_prompts
from stages.core.errors import InputError
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.evaluate import evaluation
from stages.modeling.tokenizers import ByteTokenizer
from tests.conftest import recipe_with

TOK = ByteTokenizer()


def _words(n: int) -> list[dict[str, Any]]:
    return [{"q": f"Reverse the word w{i}ord.", "a": f"dro{i}w"} for i in range(n)]


def _chats(n: int) -> list[dict[str, Any]]:
    return [
        {
            "chat": [
                {"role": "user", "content": f"Reverse the word w{i}ord."},
                {"role": "assistant", "content": f"dro{i}w"},
            ]
        }
        for i in range(n)
    ]


def _recipe(tmp_path: Path, rows: list[dict[str, Any]], columns: dict[str, str], **prompt: Any):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = {"kind": "file", "name": str(path), "columns": columns}
    data: dict[str, Any] = {
        "eval": {"size": 4, "sources": [source]},
        "grpo": {"size": 4, "sources": [source]},
        "sft": {"size": 8, "sources": [source]},
    }
    if prompt:
        data["prompt"] = prompt
        data["max_seq_len"] = 400  # a filler's target fits the row, so it is not quarantined
    return recipe_with(str(tmp_path), data=data)


def _targets(recipe: Any) -> tuple[list[str], PromptFormat]:
    splits, prompt = data_prep.draw_splits(recipe.data, TOK, data_prep.Quarantine())
    texts = []
    for example in splits["sft_train"]:
        tokens, mask = data_prep.sft_sequence(example, TOK, prompt)
        texts.append(TOK.decode([t for t, m in zip(tokens[:-1], mask[:-1], strict=True) if m]))
    return texts, prompt


@pytest.mark.parametrize(
    ("rows", "columns"),
    [(_words(20), {"prompt": "q", "answer": "a"}), (_chats(20), {"messages": "chat"})],
    ids=["prompt-answer", "chat"],
)
def test_answer_only_rows_train_on_the_answer_and_score_format_one(
    tmp_path: Path, rows: list[dict[str, Any]], columns: dict[str, str]
) -> None:
    texts, prompt = _targets(_recipe(tmp_path, rows, columns))
    assert prompt.answer_format == "answer"
    assert all(t.startswith("<answer>dro") and t.endswith("w</answer><end_of_turn>") for t in texts)
    assert not any("reasoning" in t or "calculation" in t for t in texts)
    for text in texts:
        ref = rewards.Reference(text.split("<answer>")[1].split("</answer>")[0], (), "answer")
        assert rewards.format_strict(text, ref) == 1.0
        assert rewards.format_approx(text, ref) == 1.0
        assert rewards.answer_match(text, ref) == 1.0
    assert rewards.format_strict("<reasoning>x</reasoning><answer>a</answer>", ref) == 0.0
    assert rewards.format_strict("<answer>a</answer> and more", ref) == 0.0


def test_the_dataset_records_the_answer_format_and_evaluation_grades_by_it(
    tmp_path: Path,
) -> None:
    recipe = _recipe(tmp_path, _words(20), {"prompt": "q", "answer": "a"})
    dataset = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path), "r")).output
    assert dataset.prompt.answer_format == "answer"
    rows = load_prompts(dataset, "eval")
    assert all("inside <answer> </answer>" in r["prompt"] for r in rows)
    assert not any("<reasoning>" in r["prompt"] for r in rows)
    completions = [f"<answer>{r['answer']}</answer><end_of_turn>" for r in rows]
    scored, _ = evaluation.score("m", None, rows, completions, 1, answer_format="answer")
    assert (scored.format_rate, scored.accuracy) == (1.0, 1.0)


def test_a_filler_is_opt_in_and_written_as_the_reasoning(tmp_path: Path) -> None:
    filler = "Nothing to work out."
    recipe = _recipe(tmp_path, _words(20), {"prompt": "q", "answer": "a"}, filler=filler)
    texts, prompt = _targets(recipe)
    assert prompt.answer_format == "tags"
    assert all(t.startswith(f"<reasoning>{filler}</reasoning><answer>dro") for t in texts)
    assert rewards.format_strict(texts[0], rewards.Reference("x")) == 1.0


def test_rows_with_and_without_reasoning_mixed_are_refused_naming_the_fix(
    tmp_path: Path,
) -> None:
    rows = [
        {**r, "w": "It is the letters backwards." if i % 2 else None}
        for i, r in enumerate(_words(20))
    ]
    recipe = _recipe(tmp_path, rows, {"prompt": "q", "answer": "a", "reasoning": "w"})
    with pytest.raises(InputError, match=r"10 of the 20 rows .* have no reasoning.*filler"):
        data_prep.draw_splits(recipe.data, TOK, data_prep.Quarantine())


def test_answer_only_rows_under_hashes_are_refused(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, _words(20), {"prompt": "q", "answer": "a"}, answer_format="hashes")
    with pytest.raises(InputError, match="answer_format: answer"):
        data_prep.draw_splits(recipe.data, TOK, data_prep.Quarantine())


def test_reasoned_rows_keep_the_tags_format(tmp_path: Path) -> None:
    rows = [{**r, "w": "Read it backwards."} for r in _words(20)]
    texts, prompt = _targets(
        _recipe(tmp_path, rows, {"prompt": "q", "answer": "a", "reasoning": "w"})
    )
    assert prompt == PromptFormat()
    assert all(t.startswith("<reasoning>Read it backwards.</reasoning><answer>") for t in texts)


def test_a_filler_with_the_answer_format_is_refused() -> None:
    with pytest.raises(ValidationError, match="filler 'x' is reasoning"):
        PromptFormat(answer_format="answer", filler="x")


def test_only_recipes_reading_answer_only_sources_move_their_identity(tmp_path: Path) -> None:
    smoke = recipe_with(str(tmp_path))
    assert "targets" not in data_prep.identity(smoke.data, smoke.model).config
    answer_only = _recipe(tmp_path, _words(20), {"prompt": "q", "answer": "a"})
    hashed = data_prep.identity(answer_only.data, answer_only.model).config
    assert hashed["targets"] == data_prep.ANSWER_ONLY_TARGETS
    reasoned = _recipe(tmp_path, _words(20), {"prompt": "q", "answer": "a", "reasoning": "w"})
    assert "targets" not in data_prep.identity(reasoned.data, reasoned.model).config


def test_validate_refuses_targets_that_no_generation_budget_holds(tmp_path: Path) -> None:
    """The issue's case: a filler longer than max_generation_tokens 32 made every target too
    long (format 0 with no warning); `far validate`'s check refuses it with the counts."""
    from pipeline.validate import check_sft_targets

    filler = "The request needs no calculation; I answer it directly."
    long = _recipe(tmp_path, _words(20), {"prompt": "q", "answer": "a"}, filler=filler)
    with pytest.raises(
        InputError,
        match=r"eval\.max_generation_tokens: 32 tokens; 20 of 20 SFT "
        r"targets are longer \(the shortest: \d+ tokens, row file/rows\.jsonl:",
    ):
        check_sft_targets(long, str(tmp_path / "cache"))
    answer_only = _recipe(tmp_path, _words(20), {"prompt": "q", "answer": "a"})
    check_sft_targets(answer_only, str(tmp_path / "cache"))  # `<answer>dro0w</answer>` fits


def test_validate_refuses_a_longest_target_over_the_budget_unless_the_recipe_accepts_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Some targets over the smallest max_generation_tokens: refused naming the longest and
    the opt-out; `allow_long_sft_targets: true` turns that into one warning line."""
    from pipeline.validate import check_sft_targets

    rows = _words(20)
    rows[3]["a"] = "x" * 40  # `<answer>` + 40 bytes + `</answer>`: over 32 tokens
    recipe = _recipe(tmp_path, rows, {"prompt": "q", "answer": "a"})
    cache = str(tmp_path / "cache")
    with pytest.raises(InputError) as refused:
        check_sft_targets(recipe, cache)
    message = str(refused.value)
    assert "SFT targets are longer (the longest: " in message and "of 20 SFT" in message
    assert "allow_long_sft_targets: true" in message
    accepted = recipe.model_copy(update={"allow_long_sft_targets": True})
    check_sft_targets(accepted, cache)
    assert "(the longest: " in caplog.text and "allow_long_sft_targets: true" in caplog.text
