"""Where a final answer sits in a piece of text: the <answer> tag, `#### N`, or `\\boxed{}`,
and how an answer is written in each of those formats.

Data preparation reads reference answers out of dataset solutions (MATH's last `\\boxed{}`) and
writes SFT targets in the recipe's answer format (`data.prompt.answer_format`); the rewards read
predicted answers out of completions with the same patterns, so a reference, a target and a
prediction written alike are extracted alike. Writing and reading live together here so the
two cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from schemas.recipe import AnswerFormat

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
HASHES = re.compile(r"####\s*([^\n]+)")
BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")  # one level of nested braces
ANSWER_ONLY = re.compile(r"<answer>(.+?)</answer>", re.DOTALL)  # the answer format, whole
REASONING_TAG = re.compile(r"<reasoning>(.*?)</reasoning>", re.DOTALL)
END_OF_TURN = "<end_of_turn>"
BOX_OPEN = "\\boxed{"
HASH_MARK = "####"

INSTRUCTIONS: dict[AnswerFormat, str] = {
    "tags": (
        "Think step by step inside <reasoning> </reasoning>, "
        "then give only the final answer inside <answer> </answer>."
    ),
    "hashes": (
        "Think step by step, then give only the final answer on a last line "
        "that starts with '#### '."
    ),
    "boxed": "Think step by step, then give only the final answer inside \\boxed{}.",
    "answer": "Give only the final answer inside <answer> </answer>.",
}
"""Each answer format's default instruction (PromptFormat.instruction when unset)."""


def render_answer(reasoning: str, answer: str, answer_format: AnswerFormat) -> str:
    """The reasoning and the answer written in `answer_format` (no end-of-turn marker)."""
    if answer_format == "tags":
        return f"<reasoning>{reasoning}</reasoning><answer>{answer}</answer>"
    if answer_format == "answer":  # answer-only: no reasoning is written
        return f"<answer>{answer}</answer>"
    if answer_format == "hashes":
        return f"{reasoning}\n{HASH_MARK} {answer}"
    return f"{reasoning}\n{BOX_OPEN}{answer}}}"


def last_boxed(text: str) -> str | None:
    """The contents of the last `\\boxed{...}` in `text`, stripped; None when there is none."""
    found = BOXED.findall(text)
    return found[-1].strip() if found else None


def unbox(text: str) -> str:
    """`\\boxed{x}` -> `x`; any other text unchanged."""
    match = BOXED.fullmatch(text)
    return match.group(1).strip() if match else text


def _tag(text: str) -> str | None:
    match = ANSWER_TAG.search(text)
    return match.group(1).strip() if match else None


def _first_hashes(text: str) -> str | None:
    match = HASHES.search(text)
    return match.group(1).strip() if match else None


def _hashes_line(text: str, last: bool) -> str | None:
    """A `#### N` line's N (the last or the first), without a trailing end-of-turn marker."""
    found = HASHES.findall(text)
    return found[-1 if last else 0].strip().removesuffix(END_OF_TURN).strip() if found else None


# The answer format's own place first, then the others (a completion that answers in another
# format still has its answer read). tags keeps the order FAR always used.
_EXTRACTION_ORDER: dict[AnswerFormat, tuple[Callable[[str], str | None], ...]] = {
    "tags": (_tag, _first_hashes, last_boxed),
    "answer": (_tag, _first_hashes, last_boxed),
    "hashes": (lambda text: _hashes_line(text, last=True), _tag, last_boxed),
    "boxed": (last_boxed, _tag, lambda text: _hashes_line(text, last=False)),
}


def extract_answer(completion: str, answer_format: AnswerFormat = "tags") -> str | None:
    """The final answer, looked for first where `answer_format` puts it: tags, the <answer>
    tag, else '#### N', else the last \\boxed{}; hashes, the last '#### N' first; boxed, the
    last \\boxed{} first."""
    for find in _EXTRACTION_ORDER[answer_format]:
        found = find(completion)
        if found is not None:
            return found
    return None


def reasoning_text(completion: str, answer_format: AnswerFormat = "tags") -> str | None:
    """The reasoning: inside <reasoning> (tags), or the text before the last `####` (hashes)
    or the last `\\boxed{` (boxed); None when the format's marker is missing."""
    if answer_format == "tags":
        match = REASONING_TAG.search(completion)
        return match.group(1) if match else None
    if answer_format == "answer":
        return None  # the format has no reasoning
    marker = HASH_MARK if answer_format == "hashes" else BOX_OPEN
    head, found, _ = completion.rpartition(marker)
    return head if found else None


def _body(completion: str) -> str | None:
    """The completion without surrounding whitespace and one final end-of-turn marker; None
    when an end-of-turn marker sits anywhere else."""
    body = completion.strip().removesuffix(END_OF_TURN).rstrip()
    return None if END_OF_TURN in body else body


def _final_answer(tail: str, answer_format: AnswerFormat) -> bool:
    """Whether `tail` (the text from the marker on) is an answer and nothing after it."""
    if answer_format == "hashes":
        answer = tail.removeprefix(HASH_MARK).strip()
        return bool(answer) and "\n" not in answer
    match = BOXED.match(tail)
    return match is not None and match.end() == len(tail) and bool(match.group(1).strip())


def _parts(completion: str, answer_format: AnswerFormat) -> tuple[bool, bool, bool]:
    """(the marker once, reasoning before it, a final answer after it) for hashes and boxed."""
    marker = HASH_MARK if answer_format == "hashes" else BOX_OPEN
    body = _body(completion)
    if body is None or marker not in body:
        return False, False, False
    head, _, rest = body.rpartition(marker)
    reasoned = bool(head.strip()) and (
        answer_format == "boxed" or head.rstrip(" \t").endswith("\n")
    )
    return body.count(marker) == 1, reasoned, _final_answer(marker + rest, answer_format)


def strict_format(completion: str, answer_format: AnswerFormat) -> bool:
    """hashes: reasoning, then one `#### answer` as the last line; boxed: reasoning, then one
    `\\boxed{answer}` at the very end; answer: exactly one `<answer>answer</answer>` and no
    other text. Only whitespace and one end-of-turn marker may follow. (tags is
    stages.rewards.format_strict's own check.)"""
    if answer_format == "answer":
        body = _body(completion) or ""
        match = ANSWER_ONLY.fullmatch(body)
        return match is not None and body.count("<answer>") == 1 and bool(match[1].strip())
    return all(_parts(completion, answer_format))


def approx_format(completion: str, answer_format: AnswerFormat) -> float:
    """Partial credit for hashes and boxed: 0.5 for the marker exactly once, 0.25 for
    reasoning before it, 0.25 for an answer after it with nothing else following; for
    answer, 0.5 per answer tag that appears exactly once."""
    if answer_format == "answer":
        return sum(0.5 for tag in ("<answer>", "</answer>") if completion.count(tag) == 1)
    once, reasoned, final = _parts(completion, answer_format)
    return 0.5 * once + 0.25 * reasoned + 0.25 * final
