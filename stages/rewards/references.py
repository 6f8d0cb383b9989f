"""What a reward scores a completion against: the row's reference answer, its tests, the answer
format, the prompt and the row's own columns, rebuilt from Tunix's numpy batch or from
prompt-split rows. Kept apart from the rewards so that every reward form and both callers
(GRPO's batches, evaluation's rows) read one shape."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.recipe import AnswerFormat


@dataclass(frozen=True)
class Reference:
    answer: str
    tests: tuple[str, ...] = ()
    answer_format: AnswerFormat = "tags"  # where the completion should put it (the dataset's)
    prompt: str = ""  # the prompt the model completed, as it saw it (chat-formatted)
    # the row's own columns, under the data file's names (a source with a column map)
    columns: dict[str, Any] = field(default_factory=dict, hash=False)


def references(
    answers: Sequence[Any],
    tests: Sequence[Any] | None = None,
    answer_format: AnswerFormat = "tags",
    prompts: Sequence[Any] | None = None,
    columns: Sequence[Any] | None = None,
) -> list[Reference]:
    """References from batch fields (tests and the row's columns travel JSON-encoded through
    Tunix's numpy batch), graded in `answer_format` (the dataset's)."""
    n = len(answers)
    encoded = tests if tests is not None else ["[]"] * n
    said = prompts if prompts is not None else [""] * n
    own = columns if columns is not None else ["{}"] * n
    return [
        Reference(str(a), tuple(json.loads(str(t))), answer_format, str(p), json.loads(str(c)))
        for a, t, p, c in zip(answers, encoded, said, own, strict=True)
    ]


def row_references(
    rows: Sequence[dict[str, Any]], answer_format: AnswerFormat = "tags"
) -> list[Reference]:
    """References of prompt-split rows (stages.core.datasets.load_prompts): answer, tests,
    prompt and the row's own columns."""
    return [
        Reference(
            str(r["answer"]),
            tuple(r.get("tests", ())),
            answer_format,
            str(r.get("prompt", "")),
            dict(r.get("columns", {})),
        )
        for r in rows
    ]
