"""Per-level held-out rows (SourceSpec `tag`, EvalConfig `tag`): one split drawn from several
tagged sources keeps each source's rows apart by their tag, the same generator tagged for
evaluation is de-duplicated against its training copy, an evaluation scores one tag's rows,
and an untagged recipe's rows and stage hashes are as before."""

from __future__ import annotations

import re
from typing import Any

import pytest

from schemas.recipe import DataPrepConfig, EvalConfig
from stages.core.errors import InputError
from stages.data_prep import build as data_prep
from stages.evaluate.evaluation import tagged
from stages.modeling.tokenizers import ByteTokenizer
from stages.registry import hashed_config

TOK = ByteTokenizer()


def level(terms: int, size: int, tag: str | None = None) -> dict[str, Any]:
    args = {"min_terms": terms, "max_terms": terms, "min_digits": 1, "max_digits": 1}
    source = {"kind": "reasoning_gym", "name": "basic_arithmetic", "size": size, "args": args}
    return {**source, "reasoning": "steps", **({"tag": tag} if tag else {})}


def ladder() -> DataPrepConfig:
    """Training at 2 terms, the pool at 3; held out: 20 rows at 4 terms, 10 at 3 and 10 at 2."""
    return DataPrepConfig.model_validate(
        {
            "max_seq_len": 512,
            "max_prompt_len": 256,
            "eval": {
                "size": 40,
                "sources": [level(4, 20, "k2"), level(3, 10, "k1"), level(2, 10, "le_k")],
            },
            "grpo": {"size": 30, "sources": [level(3, 60)]},
            "sft": {"size": 30, "sources": [level(2, 60)]},
        }
    )


def test_a_split_of_tagged_sources_keeps_each_level_apart() -> None:
    config = ladder()
    splits, prompt = data_prep.draw_splits(config, TOK, data_prep.Quarantine())
    rows = [data_prep.prompt_row(e, prompt) for e in splits["eval"]]
    counts = {tag: sum(r.get("tag") == tag for r in rows) for tag in ("k2", "k1", "le_k")}
    assert counts == {"k2": 20, "k1": 10, "le_k": 10}  # every row of each eval source
    terms = {"k2": 4, "k1": 3, "le_k": 2}
    for example in splits["eval"]:  # each level's rows are that level's problems
        assert len(re.findall(r"\d+", example.prompt)) == terms[example.tag], example.prompt
    trained = {e.prompt for split in ("grpo_train", "sft_train") for e in splits[split]}
    assert not trained & {e.prompt for e in splits["eval"]}  # held out, level by level
    assert all("tag" not in data_prep.prompt_row(e, prompt) for e in splits["grpo_train"])


def test_an_evaluation_scores_one_tag() -> None:
    rows = [{"id": "a", "tag": "k2"}, {"id": "b", "tag": "k1"}, {"id": "c"}]
    assert [r["id"] for r in tagged(rows, "k2")] == ["a"]
    assert tagged(rows, None) == rows
    with pytest.raises(InputError, match=r"eval tag 'k3': no row .* its tags: \['k1', 'k2'\]"):
        tagged(rows, "k3")


def test_untagged_sources_and_evaluations_keep_their_hashes_and_rows() -> None:
    plain = level(2, 5)
    assert (
        "tag"
        not in DataPrepConfig.model_validate(
            {
                "eval": {"size": 2, "sources": [plain]},
                "grpo": {"size": 1, "sources": [plain]},
                "sft": {"size": 1, "sources": [plain]},
            }
        )
        .eval.sources[0]
        .model_dump()
    )
    assert "tag" not in hashed_config("evaluate", EvalConfig())
    assert hashed_config("evaluate", EvalConfig(tag="k2"))["tag"] == "k2"
