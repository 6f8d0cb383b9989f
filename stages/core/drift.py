"""The drift guard: a run continues only with the recipe, data and code it started with.

Two checks share one diff. At the start of every session the recipe is compared with the run's
manifest (run.json), so a changed recipe is refused before anything runs. Before a stage
starts work in a new directory, its identity is compared with the run's earlier directory of
that stage (identity.json), which catches what a recipe diff cannot: changed source data
(data-prep's inputs are the sources' content fingerprints) and changed code (a bumped
STAGE_VERSION).

What counts as a code change: only a stage's STAGE_VERSION, bumped by hand when a commit alters
what the stage computes. Other commits (refactors, logging, docs) never invalidate a finished
stage; the exact commit is still recorded for audit. A downstream stage whose only difference
is an upstream fingerprint is not drift: the upstream stage already passed (or was allowed).

Allowed changes are dotted paths (`sft.max_steps`) or their prefixes (`sft`). When every change
to a training stage is a continuation setting (max_steps, checkpoint cadence), the new stage
directory starts from the old one's checkpoints: a multi-session continuation (train
longer in the next session).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stages.core.errors import InputError

# Settings that say where or for how long a run happens, never what it computes (`plugins`
# says which modules are imported; a stage using a plugin's reward hashes its code itself;
# `logging` where the curves go; `allow_long_sft_targets` what `far validate` accepts).
NOT_DRIFT = (
    "storage_root",
    "name",
    "session_budget",
    "mesh",
    "sandbox",
    "logging",
    "plugins",
    "allow_long_sft_targets",
)
# Changes after which a training stage can continue from its previous checkpoints.
CONTINUABLE = (
    "max_steps",
    "checkpoint_every_steps",
    "checkpoint_every_seconds",
    "save_margin_seconds",
    "keep_checkpoints",
)


@dataclass(frozen=True)
class Change:
    path: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.path}: {_show(self.old)} -> {_show(self.new)}"


def _show(value: Any) -> str:
    return "(absent)" if value is _ABSENT else json.dumps(value, sort_keys=True, default=str)


_ABSENT = object()


class DriftError(InputError):
    """Resuming would mix two different recipes, datasets or code versions."""

    def __init__(self, what: str, changes: list[Change], refused: list[Change]) -> None:
        self.changes, self.refused = changes, refused
        lines = [f"{what} differs from what this run started with; refusing to mix them:"]
        lines += [f"  {c}" for c in changes]
        flags = " ".join(f"--allow-change {c.path}" for c in refused)
        lines.append(
            f"Start a new run (--name NEW) or, if continuing with these changes is intended, "
            f"allow them: {flags}"
        )
        super().__init__("\n".join(lines))


def diff(old: Any, new: Any, prefix: str = "") -> list[Change]:
    """Every leaf that differs between two JSON-like values, as dotted paths. A list of
    objects that each have an "id" (a recipe's `pipeline:` nodes) is compared by id
    (`pipeline.evaluate.config.samples`); any other list is one leaf."""
    old_nodes, new_nodes = _by_id(old), _by_id(new)
    if old_nodes is not None and new_nodes is not None:
        return diff(old_nodes, new_nodes, prefix)
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[Change] = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            out += diff(old.get(key, _ABSENT), new.get(key, _ABSENT), path)
        return out
    return [] if old == new else [Change(prefix, old, new)]


def _by_id(value: Any) -> dict[str, Any] | None:
    """{id: item} for a list of objects with distinct string ids, else None."""
    if not isinstance(value, list) or not value:
        return None
    ids = [item.get("id") if isinstance(item, dict) else None for item in value]
    keys = [i for i in ids if isinstance(i, str)]
    if len(keys) != len(value) or len(set(keys)) != len(keys):
        return None
    return dict(zip(keys, value, strict=True))


def is_allowed(change: Change, allowed: Iterable[str]) -> bool:
    return any(change.path == a or change.path.startswith(a + ".") for a in allowed)


def node_allowances(allowed: Iterable[str], node: str, sections: Iterable[str]) -> tuple[str, ...]:
    """`allowed` (recipe paths) plus the same allowances as a pipeline node's stage identity
    names them: its config sits under its section (`eval.samples`), not under
    `pipeline.<node>.config.samples`. Allowing `pipeline`, `pipeline.<node>` or
    `pipeline.<node>.config` allows every section of the node's config; a deeper path the
    same setting in each section. The recipe-level check has already refused any change to
    a top-level section that was not allowed by its own name."""
    allowed, sections = tuple(allowed), tuple(sections)
    extra: list[str] = []
    for path in allowed:
        parts = path.split(".")
        if parts[0] != "pipeline" or (len(parts) > 1 and parts[1] != node):
            continue
        if len(parts) <= 2 or parts[2:] == ["config"]:
            extra += sections
        elif parts[2] == "config":
            extra += [".".join([section, *parts[3:]]) for section in sections]
    return allowed + tuple(extra)


def check(what: str, changes: list[Change], allowed: Iterable[str]) -> list[Change]:
    """Raise DriftError unless every change is allowed; return the (allowed) changes."""
    allowed = tuple(allowed)
    refused = [c for c in changes if not is_allowed(c, allowed)]
    if refused:
        raise DriftError(what, changes, refused)
    return changes


def recipe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """The recipe fields that change what a run computes (not where, or for how long)."""
    strip = lambda r: {k: v for k, v in r.items() if k not in NOT_DRIFT}  # noqa: E731
    return diff(strip(old), strip(new))


def continuable(changes: list[Change]) -> bool:
    """True when a training stage can resume its old checkpoints under these changes."""
    return bool(changes) and all(c.path.rsplit(".", 1)[-1] in CONTINUABLE for c in changes)
