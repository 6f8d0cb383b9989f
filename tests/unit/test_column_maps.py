"""Any data set through a column map (SourceSpec.columns): JSONL with its own column names,
CSV, Parquet and conversational rows, read from real files; the seven adapters as presets of
the same mechanism, with exactly the examples they gave before; and a map naming a column
the data lacks refused by `far validate` (exit 2, one line) before any compute."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from pydantic import ValidationError

from flows import cli
from schemas.recipe import PRESET_COLUMNS, PromptFormat, SourceSpec
from stages.core.errors import InputError
from stages.data_prep import build as data_prep
from stages.data_prep.adapters import ADAPTERS, BadRow, Example, example_id
from stages.data_prep.build import INSTRUCTION, chat_prompt, prompt_row, sft_sequence
from stages.data_prep.sources import check_file_columns, read_rows
from stages.modeling.tokenizers import ByteTokenizer
from tests.conftest import recipe_with, smoke_data

# Each preset on one row of its dataset's layout, and the example the adapter gave before it
# was a preset (computed with stages/data_prep/sources.py as of 852a05c).
PRESET_ROWS: dict[str, dict[str, Any]] = {
    "gsm8k": {
        "question": "Tom has 1,200 apples and eats 200. How many are left?",
        "answer": "1200 - 200 = <<1200-200=1000>>1000\n#### 1,000",
    },
    "reasoning_gym": {
        "question": "What is 7 * 6?",
        "answer": "42",
        "metadata": {"expression": "7 * 6"},
    },
    "mbpp": {
        "text": "Write a function to double a number.",
        "code": "def double(x):\r\n    return 2 * x",
        "test_setup_code": "import math",
        "test_list": ["assert double(2) == 4", "assert double(0) == 0"],
    },
    "humaneval": {
        "prompt": 'def inc(x):\n    """Add one."""\n',
        "canonical_solution": "    return x + 1\n",
        "test": "def check(f):\n    assert f(1) == 2\n",
        "entry_point": "inc",
    },
    "math": {
        "problem": "What is $\\frac{1}{2} + \\frac{1}{2}$?",
        "solution": "The sum is $\\boxed{1}$.",
    },
    "magpie": {
        "instruction": "Plan a picnic.",
        "response": "<think>Food, place, time.</think>\n\nBring sandwiches to the park at noon.",
        "task_category": "Planning",
    },
    "ultrafeedback": {
        "instruction": "Say hi.",
        "completions": [
            {"response": "Hello!", "overall_score": 7.5},
            {"response": "Go away.", "overall_score": 2},
        ],
    },
}
SRC = "file/rows.jsonl"
BEFORE: dict[str, tuple[Any, ...]] = {
    "gsm8k": (
        "file/rows.jsonl:f40a450d8ebcd687",
        "math",
        SRC,
        "Tom has 1,200 apples and eats 200. How many are left?",
        "1200 - 200 = 1000",
        "1000",
        (),
    ),
    "reasoning_gym": (
        "file/rows.jsonl:0017685cf423ed85",
        "math",
        SRC,
        "What is 7 * 6?",
        "7 * 6 = 42",
        "42",
        (),
    ),
    "mbpp": (
        "file/rows.jsonl:8e548c7514b1f2fb",
        "code",
        SRC,
        "Write a function to double a number.\nYour code should pass these tests:\n"
        "assert double(2) == 4\nassert double(0) == 0",
        "",
        "def double(x):\n    return 2 * x",
        ("import math\nassert double(2) == 4", "import math\nassert double(0) == 0"),
    ),
    "humaneval": (
        "file/rows.jsonl:28a8a409fc4956c3",
        "code",
        SRC,
        'Complete this Python function:\ndef inc(x):\n    """Add one."""',
        "",
        'def inc(x):\n    """Add one."""\n    return x + 1',
        ("def check(f):\n    assert f(1) == 2\ncheck(inc)",),
    ),
    "math": (
        "file/rows.jsonl:2575ded3418ce21f",
        "math",
        SRC,
        "What is $\\frac{1}{2} + \\frac{1}{2}$?",
        "The sum is $\\boxed{1}$.",
        "1",
        (),
    ),
    "magpie": (
        "file/rows.jsonl:f61c4e680474589c",
        "general",
        SRC,
        "Plan a picnic.",
        "Food, place, time.",
        "Bring sandwiches to the park at noon.",
        (),
    ),
    "ultrafeedback": (
        "file/rows.jsonl:e276e57b8ac9f385",
        "general",
        SRC,
        "Say hi.",
        "",
        "Hello!",
        (),
    ),
}


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _read(spec: SourceSpec) -> list[Example | str]:
    """Each row as the Example its preset makes, or the reason it is quarantined."""
    out: list[Example | str] = []
    for row in read_rows(spec, 0):
        try:
            if isinstance(row, BadRow):
                raise row
            out.append(ADAPTERS[spec.row_adapter](row, "src"))
        except BadRow as bad:
            out.append(str(bad))
    return out


@pytest.mark.parametrize("preset", sorted(PRESET_ROWS))
def test_a_preset_gives_the_old_adapters_example(tmp_path: Path, preset: str) -> None:
    path = _jsonl(tmp_path / "rows.jsonl", [PRESET_ROWS[preset]])
    spec = SourceSpec(kind="file", name=path, adapter=preset)
    [row] = read_rows(spec, 0)
    assert isinstance(row, dict)
    assert _fields(ADAPTERS[preset](row, SRC)) == BEFORE[preset]


@pytest.mark.parametrize("preset", sorted(PRESET_ROWS))
def test_a_preset_reads_its_columns_under_other_names(tmp_path: Path, preset: str) -> None:
    """`columns` with `adapter`: the same data set with its columns renamed gives the same
    example (a column of a preset's name that the map does not point at is not read)."""
    row = dict(PRESET_ROWS[preset])
    renames = {part: f"my_{col}" for part, col in PRESET_COLUMNS[preset].items() if col in row}
    for part, column in PRESET_COLUMNS[preset].items():
        if column in row:
            row[renames[part]] = row.pop(column)
            row[column] = "decoy: not the column the map names"
    path = _jsonl(tmp_path / "rows.jsonl", [row])
    spec = SourceSpec(kind="file", name=path, adapter=preset, columns=renames)
    check_file_columns(spec)
    [mapped] = read_rows(spec, 0)
    assert isinstance(mapped, dict)
    assert _fields(ADAPTERS[preset](mapped, SRC)) == BEFORE[preset]


def _fields(example: Example) -> tuple[Any, ...]:
    """The fields the old adapters had; the later ones (tag, system) at their defaults."""
    fields = dataclasses.astuple(example)
    assert fields[7:] == ("", "")
    return fields[:7]


def test_jsonl_with_its_own_column_names(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "mine.jsonl",
        [
            {"q": "What is 2 + 2?", "final": "4", "steps": "2 + 2 = 4", "reasoning": "decoy"},
            {"q": "What is 3 + 3?", "final": 6, "steps": None},  # a number; no working
            {"q": "What is 5 + 5?"},
            {"q": "  ", "final": "1", "steps": ""},
        ],
    )
    spec = SourceSpec(
        kind="file",
        name=path,
        columns={"prompt": "q", "answer": "final", "reasoning": "steps"},
    )
    check_file_columns(spec)
    first, second, missing, empty = _read(spec)
    assert isinstance(first, Example)
    assert first == Example(first.id, "general", "src", "What is 2 + 2?", "2 + 2 = 4", "4")
    assert isinstance(second, Example) and (second.answer, second.reasoning) == ("6", "")
    assert missing == "missing field 'answer' (column 'final')"
    assert empty == "empty field 'prompt' (column 'q')"


def test_csv_with_a_header(tmp_path: Path) -> None:
    """Cells are text; a JSON list in a tests cell is the list; blank lines are skipped, a row
    with the wrong number of cells is quarantined."""
    path = tmp_path / "rows.csv"
    path.write_bytes(
        "\ufeffquestion,final,checks\n"
        'Write f doubling x.,"def f(x):\n    return 2 * x","[""assert f(2) == 4""]"\n'
        "\n"
        "Say hi.,hi,\n"
        "only,two\n".encode()
    )
    spec = SourceSpec(
        kind="file",
        name=str(path),
        columns={"prompt": "question", "answer": "final", "tests": "checks"},
        domain="code",
    )
    check_file_columns(spec)  # the byte-order mark is not part of the first column's name
    code, hi, short = _read(spec)
    assert isinstance(code, Example) and code.answer == "def f(x):\n    return 2 * x"
    assert code.tests == ("assert f(2) == 4",)
    assert isinstance(hi, Example) and (hi.prompt, hi.answer, hi.tests) == ("Say hi.", "hi", ())
    assert short == "row 2 has 2 cells; the header has 3"


def test_parquet_with_its_own_column_names(tmp_path: Path) -> None:
    rows = [{"problem": f"What is {i} + 1?", "result": i + 1, "id": i} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    spec = SourceSpec(
        kind="file",
        name=str(tmp_path / "p.parquet"),
        columns={"prompt": "problem", "answer": "result"},
    )
    check_file_columns(spec)
    assert [e.answer if isinstance(e, Example) else e for e in _read(spec)] == ["1", "2", "3"]


CHATS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "<think>2 + 3 = 5</think>\n5"},
    ],
    [
        {"role": "user", "content": "Capital of France?"},
        {"role": "model", "content": "<reasoning>It is Paris.</reasoning><answer>Paris</answer>"},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": "Hi again"},
    ],
    [{"role": "user", "content": "No reply yet?"}],
    [{"role": "tool", "content": "{}"}, {"role": "assistant", "content": "ok"}],
    [{"role": "system", "content": "Rules."}, {"role": "assistant", "content": "ok"}],
    "not a list",
]


def test_conversational_rows(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chat.jsonl", [{"chat": chat} for chat in CHATS])
    spec = SourceSpec(kind="file", name=path, columns={"messages": "chat"})
    check_file_columns(spec)
    system, far_tags, *bad = _read(spec)
    assert isinstance(system, Example)
    assert (system.system, system.prompt, system.reasoning, system.answer) == (
        "Be brief.",
        "Add 2 and 3.",
        "2 + 3 = 5",
        "5",
    )
    assert system.id == example_id(system.source, "Be brief.\n\nAdd 2 and 3.")  # as before
    assert isinstance(far_tags, Example) and far_tags.system == ""
    assert (far_tags.reasoning, far_tags.answer) == ("It is Paris.", "Paris")
    assert bad == [
        "multi-turn: field 'messages' (column 'chat') has an assistant turn before its last "
        "one; an example is one exchange",
        "no assistant turn in field 'messages' (column 'chat') to answer from",
        "turn 0 of field 'messages' (column 'chat') has role 'tool'; expected system, user, "
        "assistant or model",
        "no user turn in field 'messages' (column 'chat')",
        "field 'messages' (column 'chat') must be a non-empty list of {role, content} turns",
    ]


@pytest.mark.parametrize("recipe_system", [None, "You are exact."])
def test_a_chat_rows_system_turn_comes_before_fars_instruction(
    tmp_path: Path, recipe_system: str | None
) -> None:
    """The row's own system turn opens the prompt (after the recipe's system prompt), then
    FAR's instruction, then the question: the model reads its rules before FAR's."""
    path = _jsonl(tmp_path / "chat.jsonl", [{"chat": CHATS[0]}])
    [example] = _read(SourceSpec(kind="file", name=path, columns={"messages": "chat"}))
    assert isinstance(example, Example)
    prompt = PromptFormat(system=recipe_system)
    system = "" if recipe_system is None else f"{recipe_system}\n\n"
    assert chat_prompt(example.prompt, prompt, system=example.system) == (
        f"<start_of_turn>user\n{system}Be brief.\n\n{INSTRUCTION}\nAdd 2 and 3.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    row = prompt_row(example, prompt)
    assert row["prompt"].index("Be brief.") < row["prompt"].index(INSTRUCTION)
    tokens, mask = sft_sequence(example, ByteTokenizer(), prompt)
    head = ByteTokenizer().decode([t for t, m in zip(tokens, mask, strict=True) if not m][1:])
    assert head == row["prompt"]


def test_conversation_with_an_answer_column_and_a_chosen_message_list(tmp_path: Path) -> None:
    """messages + answer: the answer column is the answer, the last assistant turn the
    working; an answer column holding a message list (a preference set's `chosen`) answers
    with its last assistant turn."""
    turns = [
        {"role": "user", "content": "What is 6 * 7?"},
        {"role": "assistant", "content": "Six sevens are 42."},
    ]
    path = _jsonl(tmp_path / "c.jsonl", [{"messages": turns, "final": "42", "chosen": turns}])
    worked = SourceSpec(kind="file", name=path, columns={"messages": "messages", "answer": "final"})
    [example] = _read(worked)
    assert isinstance(example, Example)
    assert (example.prompt, example.reasoning, example.answer) == (
        "What is 6 * 7?",
        "Six sevens are 42.",
        "42",
    )
    chosen = SourceSpec(kind="file", name=path, columns={"prompt": "final", "answer": "chosen"})
    [side] = _read(chosen)
    assert isinstance(side, Example) and side.answer == "Six sevens are 42."


def test_csv_conversation_cells_are_json(tmp_path: Path) -> None:
    path = tmp_path / "chat.csv"
    cell = json.dumps(CHATS[0]).replace('"', '""')
    path.write_text(f'id,messages\n1,"{cell}"\n')
    spec = SourceSpec(kind="file", name=str(path), columns={"messages": "messages"})
    [example] = _read(spec)
    assert isinstance(example, Example) and example.answer == "5"


def test_a_column_map_source_runs_through_data_prep(tmp_path: Path) -> None:
    """The real load_source: a map's rows become examples, its bad rows are quarantined."""
    path = _jsonl(
        tmp_path / "own.jsonl",
        [{"q": f"What is {i} + {i}?", "a": str(2 * i)} for i in range(4)] + [{"q": "x"}],
    )
    spec = SourceSpec(kind="file", name=path, columns={"prompt": "q", "answer": "a"}, domain="math")
    quarantine = data_prep.Quarantine()
    examples = data_prep.load_source(spec, 0, quarantine, data_prep.Deduper())
    assert [e.answer for e in examples] == ["0", "2", "4", "6"]
    assert {e.domain for e in examples} == {"math"}
    assert [r["reason"] for r in quarantine.rows] == ["missing field 'answer' (column 'a')"]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"prompt": "q"}, r"expected prompt and answer \(or messages"),
        ({"messages": "m", "prompt": "q"}, r"names both messages \('m'\) and prompt"),
        ({}, r"columns is empty"),
        ({"prompt": "q", "answer": "q"}, r"columns \['prompt', 'answer'\] all name column 'q'"),
        ({"promt": "q", "answer": "a"}, r"columns\.promt\s+Extra inputs are not permitted"),
        ({"prompt": "", "answer": "a"}, r"columns\.prompt\s+String should have at least 1"),
    ],
)
def test_a_map_that_cannot_work_is_refused_when_parsed(
    columns: dict[str, str], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        SourceSpec(kind="file", name="x.jsonl", columns=columns)


def test_a_preset_renames_only_its_own_columns_and_other_kinds_have_none() -> None:
    with pytest.raises(ValidationError, match=r"adapter gsm8k has no \['tests'\] column"):
        SourceSpec(kind="file", name="x.jsonl", adapter="gsm8k", columns={"tests": "t"})
    with pytest.raises(ValidationError, match=r"only hf and file sources have columns"):
        SourceSpec(kind="reasoning_gym", name="chain_sum", size=4, columns={"prompt": "q"})
    with pytest.raises(ValidationError, match=r"needs columns .* or an adapter"):
        SourceSpec(kind="file", name="x.jsonl")


def test_a_spec_without_columns_dumps_as_before() -> None:
    """Stage hashes hash the dump: a source without `columns` must not grow a key."""
    spec = SourceSpec(kind="file", name="x.jsonl", adapter="gsm8k")
    assert "columns" not in spec.model_dump(mode="json")
    mapped = SourceSpec(kind="file", name="x.jsonl", columns={"prompt": "q", "answer": "a"})
    assert mapped.model_dump(mode="json")["columns"] == {"prompt": "q", "answer": "a"}


@pytest.mark.parametrize(
    ("name", "rows", "source", "message"),
    [
        (
            "mine.jsonl",
            [{"q": "What is 1 + 1?", "final": "2"}],
            {"columns": {"prompt": "q", "answer": "answer"}},
            r"no column 'answer' \(the answer in its columns map\); its first row has columns "
            r"\['final', 'q'\]",
        ),
        (
            "gsm.jsonl",
            [{"problem": "What is 1 + 1?", "answer": "#### 2"}],
            {"adapter": "gsm8k"},
            r"no column 'question' \(the prompt of adapter gsm8k; rename it with columns\)",
        ),
        (
            "rows.csv",
            "question,final\nWhat is 1 + 1?,2\n",
            {"columns": {"prompt": "question", "answer": "final", "reasoning": "why"}},
            r"no column 'why' \(the reasoning in its columns map\).*\['final', 'question'\]",
        ),
        (  # a typo of the file's column: the close one is suggested
            "typo.jsonl",
            [{"question": "What is 1 + 1?", "final": "2"}],
            {"columns": {"prompt": "qestion", "answer": "final"}},
            r"no column 'qestion' \(the prompt in its columns map\).*; did you mean 'question'\?$",
        ),
    ],
)
def test_far_validate_refuses_a_bad_map_naming_the_column(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    rows: list[dict[str, Any]] | str,
    source: dict[str, Any],
    message: str,
) -> None:
    path = tmp_path / name
    if isinstance(rows, str):
        path.write_text(rows)
    else:
        _jsonl(path, rows)
    data = smoke_data()
    data["data"]["eval"] = {"size": 2, "sources": [{"kind": "file", "name": str(path), **source}]}
    data["storage_root"] = str(tmp_path / "runs")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data))
    code = cli.main(["validate", str(recipe)])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_INVALID, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line, no traceback
    assert lines[0].startswith("far: data.eval.sources[0]: data source ") and str(path) in lines[0]
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.npz"))


@pytest.fixture
def _datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The datasets library's cache in the test's folder, not the user's."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


@pytest.mark.usefixtures("_datasets_cache")
def test_an_hf_source_is_checked_against_its_columns_before_any_row(tmp_path: Path) -> None:
    """kind hf through the real `datasets.load_dataset` (a local dataset folder: no network):
    the map reads it, and a column it lacks is an InputError at data_prep's start naming the
    split's columns."""
    _jsonl(tmp_path / "ds" / "train.jsonl", [{"q": "What is 1 + 1?", "final": 2}])
    good = SourceSpec(
        kind="hf", name=str(tmp_path / "ds"), columns={"prompt": "q", "answer": "final"}
    )
    [example] = _read(good)
    assert isinstance(example, Example) and example.answer == "2"
    bad = SourceSpec(kind="hf", name=str(tmp_path / "ds"), columns={"prompt": "q", "answer": "a"})
    with pytest.raises(
        InputError, match=r"no column 'a' .*split 'train' has columns \['final', 'q'\]"
    ):
        next(iter(read_rows(bad, 0)))


def test_only_recipes_with_a_chat_source_move_their_data_prep_identity(tmp_path: Path) -> None:
    """The system-turn-first rendering is hashed for conversational sources alone: every
    recipe without one (all the shipped ones) keeps its data_prep hash."""
    path = _jsonl(tmp_path / "chat.jsonl", [{"chat": CHATS[0]}])
    chat = {"kind": "file", "name": path, "columns": {"messages": "chat"}}
    plain = {"kind": "file", "name": path, "columns": {"prompt": "q", "answer": "a"}}
    marker = data_prep.CHAT_SYSTEM_FIRST

    def hashed(source: dict[str, Any]) -> dict[str, Any]:
        data = smoke_data()["data"]
        data["eval"] = {"size": 1, "sources": [source]}
        recipe = recipe_with(str(tmp_path), data=data)
        return data_prep.identity(recipe.data, recipe.model).config

    assert hashed(chat)["chat_system"] == marker
    assert "chat_system" not in hashed(plain)
    smoke = recipe_with(str(tmp_path))
    assert "chat_system" not in data_prep.identity(smoke.data, smoke.model).config
