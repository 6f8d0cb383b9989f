"""Mapping each data set's row layout to FAR's one example schema: the presets.

A preset turns a row into an Example or raises BadRow with the reason; nothing is dropped
silently (the caller quarantines bad rows with their reason). A preset is a column map
(which of a dataset's columns is the prompt, the answer, ...) and the step that reads those
columns (gsm8k's numeric answer after '####', MBPP's tests in the prompt, ...).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from schemas.recipe import PRESET_COLUMNS
from stages.data_prep.chains import NotAChain, chain
from stages.rewards.answers import last_boxed

_CALC = re.compile(r"<<[^<>]*>>")


_NUMBER = re.compile(r"^[-+]?\$?(?:\d[\d,]*)(?:\.\d+)?%?$")


_MAGPIE_DOMAINS = {
    "Math": "math",
    "Data analysis": "math",
    "Coding & Debugging": "code",
    "Creative writing": "creative",
    "Role playing": "creative",
    "Brainstorming": "creative",
    "Editing": "summarization",
    "Information seeking": "general",
    "Reasoning": "general",
    "Planning": "general",
    "Advice seeking": "general",
    "Others": "general",
}


# In a row read through a source's column map: {the preset's column: the source's own column},
# so a quarantine reason names the column the data set calls it. No file's column is named so.
RENAMED = "\x00renamed"


class BadRow(ValueError):
    """A row that cannot become an Example; the message is the quarantine reason."""


@dataclass(frozen=True)
class Example:
    id: str
    domain: str
    source: str
    prompt: str
    reasoning: str  # may be empty: the source has no reference reasoning
    answer: str
    tests: tuple[str, ...] = ()
    tag: str = ""  # its source's `tag` (SourceSpec), written into prompt rows when set
    # a chat row's own system turns: rendered first, before FAR's instruction and the question
    system: str = ""


@dataclass(frozen=True)
class MappedExample(Example):
    """An example of a source read through a column map, with the row's own columns under
    its names: a user's reward sees them (stages/rewards `Reference.columns`)."""

    columns: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False, compare=False)

    @classmethod
    def of(cls, example: Example, columns: dict[str, Any]) -> MappedExample:
        return cls(
            **{f.name: getattr(example, f.name) for f in dataclasses.fields(Example)},
            columns=columns,
        )


def clean_lines(text: str) -> str:
    """NFC unicode, \\n line ends, no trailing spaces, no blank lines at either end; the
    first line keeps its indentation (code)."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


def clean_text(text: str) -> str:
    """`clean_lines`, and no leading spaces either; indentation inside lines is kept."""
    return clean_lines(text).strip()


def _named(row: dict[str, Any], key: str) -> str:
    """'key', or 'key' (column 'theirs') when a column map renamed the source's column."""
    renamed = row.get(RENAMED)
    if isinstance(renamed, dict) and key in renamed and renamed[key] != key:
        return f"{key!r} (column {renamed[key]!r})"
    return repr(key)


def field(row: dict[str, Any], key: str) -> str:
    """A required, non-empty text field, cleaned."""
    if key not in row or row[key] is None:
        raise BadRow(f"missing field {_named(row, key)}")
    value = row[key]
    if not isinstance(value, str):
        raise BadRow(f"field {_named(row, key)} is {type(value).__name__}, expected text")
    value = clean_text(value)
    if not value:
        raise BadRow(f"empty field {_named(row, key)}")
    return value


def code_field(row: dict[str, Any], key: str) -> str:
    """A required code field: checked like `field`, but its first line keeps its indentation
    (HumanEval's canonical solution is a function body, so it starts indented)."""
    field(row, key)
    return clean_lines(row[key])


def text_list(row: dict[str, Any], key: str) -> tuple[str, ...]:
    value = row.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise BadRow(f"field {_named(row, key)} must be a non-empty list of text")
    return tuple(clean_text(v) for v in value)


def example_id(source: str, prompt: str) -> str:
    return f"{source}:{hashlib.sha256(prompt.encode()).hexdigest()[:16]}"


def _make(
    source: str, domain: str, prompt: str, reasoning: str, answer: str, tests: tuple[str, ...] = ()
) -> Example:
    return Example(example_id(source, prompt), domain, source, prompt, reasoning, answer, tests)


def numeric_answer(text: str) -> str:
    """'1,234' -> '1234', '$18' -> '18'; BadRow if it is not a number."""
    text = text.strip()
    if not _NUMBER.match(text):
        raise BadRow(f"unparseable answer: {text[:40]!r} is not a number")
    return text.replace(",", "").replace("$", "").rstrip("%")


def adapt_gsm8k(row: dict[str, Any], source: str) -> Example:
    """GSM8K: strip <<calc>> annotations; the answer follows '#### '."""
    question, solution = field(row, "question"), field(row, "answer")
    if "####" not in solution:
        raise BadRow("unparseable answer: no '#### N' in the solution")
    reasoning, answer = solution.rsplit("####", 1)
    return _make(
        source, "math", question, clean_text(_CALC.sub("", reasoning)), numeric_answer(answer)
    )


def adapt_reasoning_gym(row: dict[str, Any], source: str) -> Example:
    """reasoning-gym items: gsm_symbolic carries a worked solution, arithmetic an expression."""
    question, answer = field(row, "question"), field(row, "answer")
    meta = row.get("metadata") or {}
    if "answer_cot" in meta:
        reasoning = clean_text(str(meta["answer_cot"]).split("####")[0])
    elif "expression" in meta:
        reasoning = f"{meta['expression']} = {answer}"
    else:
        reasoning = ""
    return _make(source, "math", question, reasoning, answer)


def adapt_reasoning_gym_steps(row: dict[str, Any], source: str) -> Example:
    """reasoning-gym items with a worked chain (SourceSpec `reasoning: steps`): the reasoning
    is the expression in the row's metadata reduced one operation per step
    (stages/data_prep/chains.py); a row without one, or whose chain does not end in its
    answer, is a BadRow."""
    example = adapt_reasoning_gym(row, source)
    meta = row.get("metadata")
    expression = meta.get("expression") if isinstance(meta, dict) else None
    if not isinstance(expression, str):
        raise BadRow("reasoning steps: no 'expression' in the row's metadata to work a chain from")
    try:
        worked, value = chain(expression)
    except NotAChain as e:
        raise BadRow(f"reasoning steps: {e}") from e
    if str(value) != example.answer:
        raise BadRow(
            f"reasoning steps: the chain of {expression[:60]!r} ends in {value}; the row's "
            f"answer is {example.answer[:40]!r}"
        )
    return replace(example, reasoning=worked)


def adapt_mbpp(row: dict[str, Any], source: str) -> Example:
    """MBPP: the problem plus its tests as the prompt; reference code as the answer."""
    problem, code, tests = field(row, "text"), field(row, "code"), text_list(row, "test_list")
    setup = clean_text(str(row.get("test_setup_code") or ""))
    prompt = f"{problem}\nYour code should pass these tests:\n" + "\n".join(tests)
    runnable = tuple(f"{setup}\n{t}" if setup else t for t in tests)
    return _make(source, "code", prompt, "", code, runnable)


def adapt_humaneval(row: dict[str, Any], source: str) -> Example:
    """HumanEval: complete the function; the test suite's check() runs on entry_point."""
    stub, solution = field(row, "prompt"), code_field(row, "canonical_solution")
    test, entry = field(row, "test"), field(row, "entry_point")
    prompt = f"Complete this Python function:\n{stub}"
    return _make(source, "code", prompt, "", f"{stub}\n{solution}", (f"{test}\ncheck({entry})",))


def adapt_math(row: dict[str, Any], source: str) -> Example:
    """MATH (Minerva layout): the answer field, else the last \\boxed{} of the solution."""
    problem, solution = field(row, "problem"), field(row, "solution")
    answer = clean_text(str(row.get("answer") or ""))
    if not answer:
        boxed = last_boxed(solution)
        if boxed is None:
            raise BadRow("unparseable answer: no answer field and no \\boxed{} in the solution")
        answer = clean_text(boxed)
    return _make(source, "math", problem, solution, answer)


def adapt_magpie(row: dict[str, Any], source: str) -> Example:
    """Magpie-Reasoning-V2: 'instruction', and a 'response' whose <think> part is the trace."""
    instruction, response = field(row, "instruction"), field(row, "response")
    if "</think>" in response:
        thought, answer = response.split("</think>", 1)
        reasoning = clean_text(thought.replace("<think>", ""))
    else:  # the Llama CoT variants: the last paragraph is the answer
        reasoning, _, answer = response.rpartition("\n\n")
    answer = clean_text(answer)
    if not answer:
        raise BadRow("empty answer after the reasoning in 'response'")
    domain = _MAGPIE_DOMAINS.get(str(row.get("task_category") or ""), "general")
    return _make(source, domain, instruction, clean_text(reasoning), answer)


def adapt_ultrafeedback(row: dict[str, Any], source: str) -> Example:
    """UltraFeedback (openbmb layout): the completion with the highest overall_score."""
    instruction = field(row, "instruction")
    completions = row.get("completions")
    if not isinstance(completions, list) or not completions:
        raise BadRow("field 'completions' must be a non-empty list")
    scored = [
        c
        for c in completions
        if isinstance(c, dict) and isinstance(c.get("overall_score"), int | float)
    ]
    if not scored:
        raise BadRow("no completion has a numeric 'overall_score'")
    best = max(scored, key=lambda c: float(c["overall_score"]))
    return _make(source, "general", instruction, "", field(best, "response"))


_THINK = re.compile(r"^\s*<think>(.*?)</think>(.*)$", re.DOTALL)


_FAR_TARGET = re.compile(
    r"^\s*<reasoning>(.*?)</reasoning>\s*<answer>(.*?)</answer>\s*$", re.DOTALL
)


_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "model": "assistant"}


def adapt_columns(row: dict[str, Any], source: str) -> Example:
    """A source's own column map (schemas.recipe.ColumnMap): plain or conversational rows.

    The row holds only the mapped columns, under their part's name; RENAMED says which parts
    were mapped (a row may lack a mapped column: that row is quarantined, not the source).
    """
    mapped = row.get(RENAMED) or {}
    system = ""
    reasoning = _optional_text(row, "reasoning") if "reasoning" in mapped else ""
    tests = _tests(row, "tests") if "tests" in mapped else ()
    where = "answer" if "answer" in mapped else "messages"
    if "messages" not in mapped:
        prompt = field(row, "prompt")
        working, answer = _answer(row, "answer")
    else:
        system, prompt, turn = conversation(row, "messages")
        if turn is None and "answer" not in mapped:
            raise BadRow(f"no assistant turn in field {_named(row, 'messages')} to answer from")
        working, answer = split_target(turn or "")
        if "answer" in mapped:  # the answer has its own column: the whole turn is the working
            working, answer = (
                "\n\n".join(p for p in (working, answer) if p),
                _answer(row, "answer")[1],
            )
    if not answer:
        raise BadRow(f"empty answer in field {_named(row, where)}")
    example = _make(source, "general", prompt, reasoning or working, answer, tests)
    if "messages" in mapped and system:  # its id is the whole conversation's, as before
        whole = f"{system}\n\n{prompt}"
        return replace(example, id=example_id(source, whole), system=system)
    return example


def split_target(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a response: a leading <think>R</think> then A, or FAR's own
    <reasoning>R</reasoning><answer>A</answer>, is split; any other text is all answer."""
    for pattern in (_FAR_TARGET, _THINK):
        if match := pattern.match(text):
            return clean_text(match.group(1)), clean_text(match.group(2))
    return "", clean_text(text)


def conversation(row: dict[str, Any], key: str) -> tuple[str, str, str | None]:
    """(system, prompt, the last assistant turn's content or None) of a {role, content} turn
    list.

    The system text is the system turns, the prompt the user turns, before the last assistant
    turn, each joined by blank lines: the system text is rendered first, before FAR's
    instruction (build.chat_prompt). An assistant turn before the last one is a multi-turn
    row (BadRow: an example is one exchange). A JSON text (a CSV cell) is decoded first.
    """
    turns = _decoded(row.get(key))
    name = _named(row, key)
    if not isinstance(turns, list) or not turns:
        raise BadRow(f"field {name} must be a non-empty list of {{role, content}} turns")
    parsed = [_turn(turn, index, name) for index, turn in enumerate(turns)]
    last = parsed.pop()[1] if parsed[-1][0] == "assistant" else None
    if any(role == "assistant" for role, _ in parsed):
        raise BadRow(
            f"multi-turn: field {name} has an assistant turn before its last one; "
            f"an example is one exchange"
        )
    if not any(role == "user" for role, _ in parsed):
        raise BadRow(f"no user turn in field {name}")
    system = _joined(content for role, content in parsed if role == "system")
    prompt = _joined(content for role, content in parsed if role == "user")
    if not prompt:
        raise BadRow(f"empty prompt: the user turns of field {name} are empty")
    return system, prompt, last


def _joined(texts: Iterable[str]) -> str:
    return "\n\n".join(text for content in texts if (text := clean_text(content)))


def _turn(turn: Any, index: int, name: str) -> tuple[str, str]:
    if not (
        isinstance(turn, dict)
        and isinstance(turn.get("role"), str)
        and isinstance(turn.get("content"), str)
    ):
        raise BadRow(f"turn {index} of field {name} is not a {{role: text, content: text}}")
    role = _ROLES.get(turn["role"])
    if role is None:
        raise BadRow(
            f"turn {index} of field {name} has role {turn['role']!r}; expected system, user, "
            f"assistant or model"
        )
    return role, turn["content"]


def _answer(row: dict[str, Any], key: str) -> tuple[str, str]:
    """(reasoning, answer) of an answer column: text, or a message list (its last assistant
    turn, e.g. a preference set's `chosen`)."""
    value = _decoded(row.get(key))
    if isinstance(value, list):
        turns = [_turn(turn, index, _named(row, key)) for index, turn in enumerate(value)]
        replies = [content for role, content in turns if role == "assistant"]
        if not replies:
            raise BadRow(f"no assistant turn in field {_named(row, key)} to answer from")
        return split_target(replies[-1])
    if isinstance(value, int | float) and not isinstance(value, bool):  # a numeric column
        return "", str(value)
    return split_target(field(row, key))


def _optional_text(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRow(f"field {_named(row, key)} is {type(value).__name__}, expected text")
    return clean_text(value)


def _tests(row: dict[str, Any], key: str) -> tuple[str, ...]:
    """A list of test texts, or one text (one test); none: no tests."""
    value = _decoded(row.get(key))
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (clean_text(value),)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(clean_text(v) for v in value)
    raise BadRow(f"field {_named(row, key)} must be a text or a list of texts")


def _decoded(value: Any) -> Any:
    """A JSON list kept as text (a CSV cell) as the list; any other value as it is."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            return value
    return value


@dataclass(frozen=True)
class Preset:
    """A row layout: its column map (schemas.recipe.PRESET_COLUMNS: part -> its column), the
    step that reads a row by those columns, the parts a row may lack, and any other column
    the step reads by name."""

    columns: dict[str, str]
    read: Callable[[dict[str, Any], str], Example]
    optional: frozenset[str] = frozenset()
    extra: tuple[str, ...] = ()


PRESETS: dict[str, Preset] = {
    "reasoning_gym": Preset(PRESET_COLUMNS["reasoning_gym"], adapt_reasoning_gym),
    "gsm8k": Preset(PRESET_COLUMNS["gsm8k"], adapt_gsm8k),
    "mbpp": Preset(PRESET_COLUMNS["mbpp"], adapt_mbpp),
    "humaneval": Preset(PRESET_COLUMNS["humaneval"], adapt_humaneval, extra=("entry_point",)),
    "math": Preset(PRESET_COLUMNS["math"], adapt_math, optional=frozenset({"answer"})),
    "magpie": Preset(PRESET_COLUMNS["magpie"], adapt_magpie),
    "ultrafeedback": Preset(PRESET_COLUMNS["ultrafeedback"], adapt_ultrafeedback),
}


# Each preset's step by name (SourceSpec.row_adapter), and "columns": a column map alone.
ADAPTERS: dict[str, Callable[[dict[str, Any], str], Example]] = {
    **{name: preset.read for name, preset in PRESETS.items()},
    "columns": adapt_columns,
}
