"""A source's own column map: renaming its columns to its preset's before the preset reads them.

The seven dataset presets and any other data set ("columns": the map alone) go through this
one mechanism; a map naming a column the data does not have is an InputError before any
compute.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Any

from schemas.recipe import PRESET_COLUMNS, SourceSpec
from stages.core.errors import InputError, closest
from stages.data_prep.adapters import ADAPTERS, PRESETS, RENAMED, Example, adapt_reasoning_gym_steps


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
            close = closest(column, have)
            hint = f"; did you mean {close!r}?" if close else ""
            raise InputError(
                f"data source {spec.name} has no column {column!r} ({what}); {where} has "
                f"columns {sorted(have)}{hint}"
            )
