"""Where a final answer sits in a piece of text: the <answer> tag, `#### N`, or `\\boxed{}`.

Data preparation reads reference answers out of dataset solutions (MATH's last `\\boxed{}`) and
the rewards read predicted answers out of completions with the same patterns, so a reference
and a prediction written alike are extracted alike.
"""

from __future__ import annotations

import re

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
HASHES = re.compile(r"####\s*([^\n]+)")
BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")  # one level of nested braces


def last_boxed(text: str) -> str | None:
    """The contents of the last `\\boxed{...}` in `text`, stripped; None when there is none."""
    found = BOXED.findall(text)
    return found[-1].strip() if found else None


def unbox(text: str) -> str:
    """`\\boxed{x}` -> `x`; any other text unchanged."""
    match = BOXED.fullmatch(text)
    return match.group(1).strip() if match else text


def extract_answer(completion: str) -> str | None:
    """The final answer: the <answer> tag, else '#### N', else the last \\boxed{}."""
    for pattern in (ANSWER_TAG, HASHES):
        match = pattern.search(completion)
        if match:
            return match.group(1).strip()
    return last_boxed(completion)
