"""Rewards registered by name, FAR's own and a user's alike, and each registered form adapted
to the one shape every caller uses: `score(completions, refs, stats) -> list[float | None]`.

A function is registered as `fn(completion, ref) -> float` (per completion), TRL's
`fn(prompts, completions, **columns) -> list[float | None]` (batch, told by its `**kwargs`),
or with batch=True `fn(completions, refs, stats)` (a reward that may run code in the sandbox).
FAR's own rewards are those defined in this package (PACKAGE): they are called as written and
recorded under the package's name, their stage's STAGE_VERSION covering their code. A user's
is guarded (stages/rewards/guard.py) and fingerprinted: the sha256 of its module's source file
enters the identity of a stage that uses it (`reward_sources`).
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from stages.core.errors import InputError, closest
from stages.core.identity import REWARD_SOURCE, SOURCE_PREFIX
from stages.rewards.guard import call_within, checked_scores, form_of
from stages.rewards.references import Reference
from stages.rewards.sandboxing import SandboxStats

PACKAGE = "stages.rewards"
"""FAR's rewards package: a reward defined in it (or a module under it) is FAR's own."""

Scores = list[float | None]  # None: not applicable (a user's batch-form reward only)
BatchScore = Callable[[Sequence[str], Sequence[Reference], SandboxStats], Scores]
PairScore = Callable[[str, Reference], float]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Reward:
    name: str
    score: BatchScore
    doc: str
    module: str = PACKAGE  # the module that defines the function (PACKAGE for FAR's own)
    # sha256 of that module's source file; None for FAR's own (STAGE_VERSION covers those)
    digest: str | None = None


REGISTRY: dict[str, Reward] = {}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED = ("preset",)  # `rewards: {preset: NAME}` names a preset, not a reward


class DuplicateReward(InputError):
    """A reward name registered twice (two modules, or a plugin naming one of FAR's)."""


class UnknownReward(InputError):
    """A recipe names a reward no module registered."""


def reward(name: str, *, batch: bool = False) -> Callable[[F], F]:
    """Register the decorated function as reward `name` (see `register_reward`); the function
    is returned unchanged, so it can still be called and tested directly."""

    def decorate(fn: F) -> F:
        register_reward(name, fn, batch=batch)
        return fn

    return decorate


def is_shipped(module: str) -> bool:
    """True for a module of FAR's rewards package (its own rewards), not a user's."""
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def register_reward(name: str, fn: Callable[..., Any], *, batch: bool = False) -> Reward:
    """Register `fn` as reward `name`: `fn(completion, ref) -> float` for one completion,
    TRL's `fn(prompts, completions, **columns) -> list[float | None]` for a batch (told by its
    `**kwargs`), or with batch=True `fn(completions, refs, stats) -> list[float]` (what a
    reward that runs code needs: `run_sandboxed(sources, stats)`). A name registered already
    is refused (DuplicateReward names the module that has it), and so is a function of neither
    form (BadRewardSignature names both)."""
    if not isinstance(name, str) or not _NAME.match(name) or name in RESERVED:
        raise ValueError(
            f"reward name {name!r}: expected an identifier (letters, digits, _), not "
            f"{list(RESERVED)}"
        )
    if not callable(fn):
        raise TypeError(f"reward {name!r}: expected a function, got {type(fn).__name__}")
    module = getattr(fn, "__module__", None) or "?"
    if name in REGISTRY:
        raise DuplicateReward(
            f"reward {name!r} is registered already (by {REGISTRY[name].module}); {module} "
            f"must give its reward another name"
        )
    shipped = is_shipped(module)
    form = "sandbox" if batch else form_of(name, fn)
    scores = {"sandbox": fn, "completion": _pairwise(fn), "batch": _columnwise(fn)}[form]
    found = Reward(
        name,
        scores if shipped else _guarded(name, module, scores, allow_none=form == "batch"),
        (fn.__doc__ or "").strip(),
        PACKAGE if shipped else module,
        None if shipped else _source_digest(name, module),
    )
    REGISTRY[name] = found
    return found


def unregister_reward(name: str) -> None:
    """Remove a reward registered by a plugin (a test's, when it ends); FAR's own stay."""
    found = REGISTRY.get(name)
    if found is not None and found.module == PACKAGE:
        raise ValueError(f"reward {name!r} is FAR's own and cannot be unregistered")
    REGISTRY.pop(name, None)


def _source_digest(name: str, module: str) -> str:
    """sha256 of the source file of the module that defines a user's reward."""
    path = getattr(sys.modules.get(module), "__file__", None)
    if path is None or not Path(path).is_file():
        raise ValueError(
            f"reward {name!r}: its module {module!r} has no source file to fingerprint; "
            f"define the reward in a module file (imported with --plugin MODULE)"
        )
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _pairwise(fn: PairScore) -> BatchScore:
    def score(completions: Sequence[str], refs: Sequence[Reference], _: SandboxStats) -> Scores:
        return [fn(c, r) for c, r in zip(completions, refs, strict=True)]

    return score


RESERVED_COLUMNS = ("prompts", "completions")  # the batch form's own arguments


def batch_columns(refs: Sequence[Reference]) -> dict[str, list[Any]]:
    """The batch form's `**columns`: each column of the rows (None where a row lacks it),
    then FAR's `answer` (the reference answer as FAR read it) and `tests`."""
    names = dict.fromkeys(n for r in refs for n in r.columns if n not in RESERVED_COLUMNS)
    columns = {n: [r.columns.get(n) for r in refs] for n in names}
    columns["answer"] = [r.answer for r in refs]
    columns["tests"] = [list(r.tests) for r in refs]
    return columns


def _columnwise(fn: Callable[..., Any]) -> BatchScore:
    """TRL's batch form: keywords only, one list entry per completion."""

    def score(completions: Sequence[str], refs: Sequence[Reference], _: SandboxStats) -> Scores:
        prompts = [r.prompt for r in refs]
        got: Scores = fn(prompts=prompts, completions=list(completions), **batch_columns(refs))
        return got

    return score


def _guarded(name: str, module: str, scores: BatchScore, allow_none: bool) -> BatchScore:
    """A user's reward, refusing what would corrupt training silently (a NaN, a string, a
    missing score), within its call limit, naming the reward (and the completion) when it
    raises, exits, blocks or returns such a value."""

    def score(completions: Sequence[str], refs: Sequence[Reference], stats: SandboxStats) -> Scores:
        got = call_within(name, module, lambda: scores(completions, refs, stats), stats.limit)
        return checked_scores(name, module, got, completions, allow_none)

    return score


def get_reward(name: str) -> Reward:
    """The reward registered as `name`; UnknownReward names the registered ones."""
    found = REGISTRY.get(name)
    if found is None:
        close = closest(name, REGISTRY)
        hint = f"did you mean {close!r}? " if close else ""
        raise UnknownReward(
            f"unknown reward {name!r}; registered rewards: {sorted(REGISTRY)}; {hint}a reward "
            f"of your own is registered by a module named by --plugin MODULE or the recipe's "
            f"plugins (docs/your-own-task.md)"
        )
    return found


def validate_names(weights: dict[str, float]) -> None:
    for name in weights:
        get_reward(name)


def reward_sources(names: Sequence[str]) -> dict[str, str]:
    """The stage-identity inputs of a user's rewards among `names`: "source:reward:NAME:MODULE"
    -> sha256 of the reward's source file (FAR's own add nothing: their stage's STAGE_VERSION
    covers them). Changed reward code changes the stage hash, and the record names the digest."""
    found = {}
    for name in names:
        r = get_reward(name)
        if r.digest is not None:
            found[f"{SOURCE_PREFIX}{REWARD_SOURCE}{name}:{r.module}"] = r.digest
    return found


def applicable_mean(values: Sequence[float | None]) -> float | None:
    """The mean of the values that apply (not None); None when none does."""
    found = [v for v in values if v is not None]
    return sum(found) / len(found) if found else None
