"""The one error type for "the user must fix an input": a recipe field, a data file, a model
or checkpoint location, the devices asked for.

Whoever runs FAR (the `far` command, the scheduled deployment) turns an InputError into one
line naming the field or file and what was expected, and exit status 2, wherever in the run it
was raised; every other exception is a defect or an outage and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class InputError(ValueError):
    """An input or configuration the user must fix; the message names it and what was expected."""


class MissingInput(InputError, FileNotFoundError):
    """A file, directory or checkpoint the run was pointed at does not exist."""


class UnreachableInput(InputError, ConnectionError):
    """A model or dataset host that cannot be reached (offline): never retried."""


class TamperedStage(InputError):
    """A complete stage whose files or record no longer match what was committed: not reused."""


def is_input_error(error: BaseException) -> bool:
    """True for an InputError anywhere in the exception's cause/context chain."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, InputError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def closest(name: str, known: Iterable[str]) -> str | None:
    """The one of `known` closest to `name` (difflib's ratio of at least 0.6), or None: what a
    "did you mean ...?" in an error message offers. Each message words the hint itself."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return close[0] if close else None
