"""Rewards: typed functions registered by name, shared by GRPO (as rewards) and evaluation
(as metrics).

Each reward scores a batch of completions against their references (answer and, for code,
tests). Pure ones are plain functions of one pair; the verifiers that must execute untrusted
text, math-verify on model-written math (stages/rewards/math_grading.py) and MBPP/HumanEval
tests on model-written code (stages/rewards/code_tests.py), run in the sandbox
(stages/rewards/sandbox.py, through `run_sandboxed`). The sandbox only computes; every verdict
is decided here from plain data, and a crash, refusal or timeout scores 0 and is counted,
never raised.

A reward is registered one way, FAR's own and a user's alike: `@reward("name")` on a function
`(completion: str, ref: Reference) -> float`, or on TRL's batch form
`(prompts, completions, **columns) -> list[float | None]` (told by its `**kwargs`; None: not
applicable), or with `batch=True` on `(completions, refs, stats)` for one that scores a whole
batch and may run code in the sandbox (stages/rewards/guard.py says how a user's is called and
guarded). A user's module is imported by `--plugin MODULE` or a
recipe's `plugins:` list (pipeline/plugins.py); its rewards run here, in the trusted grader
process, and receive model output as plain strings. A stage that uses a user's reward hashes
the sha256 of the reward's source file into its identity (`reward_sources`), so changed reward
code never reuses a stale result, and the digest shows in the stage's lineage.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from schemas.recipe import AnswerFormat
from stages.core.errors import InputError
from stages.core.identity import REWARD_SOURCE, SOURCE_PREFIX
from stages.core.runner import RunContext
from stages.rewards.answers import (
    approx_format,
    extract_answer,
    reasoning_text,
    strict_format,
    unbox,
)
from stages.rewards.code_tests import (
    Check,
    CpuLimits,
    Ungradable,
    harness,
    imports_of,
    parse_test,
    passes,
    read_results,
)
from stages.rewards.guard import (
    BadRewardSignature as BadRewardSignature,
)
from stages.rewards.guard import (
    CallLimit,
    RewardFailed,
    call_within,
    checked_scores,
    completion_text,
    form_of,
)
from stages.rewards.math_grading import MathRuns, is_text_answer, symbolic_verdicts
from stages.rewards.sandbox import Isolation, Limits, SandboxResult, missing_isolation, run_many

# With each tag counted once (format_strict), the lazy groups cannot run past a second tag
_STRICT_FORMAT = re.compile(
    r"^\s*<reasoning>(?P<reasoning>.+?)</reasoning>\s*<answer>(?P<answer>.+?)</answer>\s*"
    r"(?:<end_of_turn>\s*)?$",
    re.DOTALL,
)
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
_TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
_END_OF_TURN = "<end_of_turn>"


@dataclass(frozen=True)
class Reference:
    answer: str
    tests: tuple[str, ...] = ()
    answer_format: AnswerFormat = "tags"  # where the completion should put it (the dataset's)
    prompt: str = ""  # the prompt the model completed, as it saw it (chat-formatted)
    # the row's own columns, under the data file's names (a source with a column map)
    columns: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass
class SandboxStats:
    """Where sandboxed verifications run (isolation level, pool size) and how they went:
    processes started (or that the host could not start), crashed or timed out (all scored 0,
    the run continued), and tests whose shape cannot be graded safely (scored 0)."""

    isolation: Isolation = "bwrap"
    workers: int | None = None  # sandboxes at a time; None: one per CPU
    runs: int = 0
    failures: int = 0
    ungradable: int = 0
    limit: CallLimit = field(default_factory=CallLimit)  # one call of a user's reward

    def fresh(self) -> SandboxStats:
        """The same settings with the counters at 0."""
        return replace(self, runs=0, failures=0, ungradable=0)


Scores = list[float | None]  # None: not applicable (a user's batch-form reward only)
BatchScore = Callable[[Sequence[str], Sequence[Reference], SandboxStats], Scores]
PairScore = Callable[[str, Reference], float]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Reward:
    name: str
    score: BatchScore
    doc: str
    module: str = __name__  # the module that defines the function
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
    shipped = module == __name__
    form = "sandbox" if batch else form_of(name, fn)
    scores = {"sandbox": fn, "completion": _pairwise(fn), "batch": _columnwise(fn)}[form]
    found = Reward(
        name,
        scores if shipped else _guarded(name, module, scores, allow_none=form == "batch"),
        (fn.__doc__ or "").strip(),
        module,
        None if shipped else _source_digest(name, module),
    )
    REGISTRY[name] = found
    return found


def unregister_reward(name: str) -> None:
    """Remove a reward registered by a plugin (a test's, when it ends); FAR's own stay."""
    if name in BUILTIN:
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


@reward("format_strict")
def format_strict(completion: str, ref: Reference) -> float:
    """1.0 when the completion is exactly <reasoning>...</reasoning><answer>...</answer>: each
    tag once, nothing after the answer but the end-of-turn marker (and whitespace). Under the
    hashes or boxed answer format: reasoning, then one `#### answer` last line or one
    `\\boxed{answer}` at the end (stages/rewards/answers.py)."""
    if ref.answer_format != "tags":
        return 1.0 if strict_format(completion, ref.answer_format) else 0.0
    match = _STRICT_FORMAT.match(completion)
    if match is None or any(completion.count(tag) != 1 for tag in _TAGS):
        return 0.0
    return 0.0 if _END_OF_TURN in match["reasoning"] + match["answer"] else 1.0


@reward("format_approx")
def format_approx(completion: str, ref: Reference) -> float:
    """0.25 per format tag that appears exactly once (partial credit while learning); under
    hashes or boxed, 0.5 for the marker once, 0.25 each for reasoning and a final answer."""
    if ref.answer_format != "tags":
        return approx_format(completion, ref.answer_format)
    return sum(0.25 for tag in _TAGS if completion.count(tag) == 1)


def answers_equal(predicted: str, reference: str) -> bool:
    """Numeric comparison when both parse as numbers (1e-6 relative), else exact text."""
    p, r = (x.strip().replace(",", "").replace("$", "") for x in (predicted, reference))
    p = unbox(p)
    if _NUMBER.match(p) and _NUMBER.match(r):
        a, b = float(p), float(r)
        return abs(a - b) <= 1e-6 * max(1.0, abs(b))
    return p == r


@reward("answer_match")
def answer_match(completion: str, ref: Reference) -> float:
    """1.0 when the extracted answer equals the reference (numerically or as text)."""
    predicted = extract_answer(completion, ref.answer_format)
    return 1.0 if predicted is not None and answers_equal(predicted, ref.answer) else 0.0


@reward("reasoning_quality")
def reasoning_quality(completion: str, ref: Reference) -> float:
    """Trajectory shaping: reasoning present, in steps (up to 3 count), of sensible length."""
    found = reasoning_text(completion, ref.answer_format)
    if not found or not found.strip():
        return 0.0
    text = found.strip()
    steps = len([s for s in re.split(r"\n+|(?<=[.;])\s+", text) if len(s.strip()) > 2])
    length = 1.0 if 10 <= len(text) <= 2000 else 0.5
    return round(min(steps, 3) / 3 * length, 6)


def _worth_verifying(predicted: str, reference: str) -> bool:
    """False when the plain comparison already decided: a plain-number reference against a
    plain number, or against text without a single digit, or a text reference (no sandbox
    needed for those)."""
    p, r = (x.strip().replace(",", "").replace("$", "") for x in (predicted, reference))
    if is_text_answer(r):
        return False
    if not _NUMBER.match(r):
        return True
    return not _NUMBER.match(unbox(p)) and any(c.isdigit() for c in p)


@reward("math_equivalent", batch=True)
def math_equivalent(
    completions: Sequence[str], refs: Sequence[Reference], stats: SandboxStats
) -> list[float]:
    """1.0 when the answer equals the reference numerically or as text, else by math-verify
    (sandboxed); a text reference (`is_text_answer`) is decided by the comparison alone."""
    scores, pending = [], []
    for i, (completion, ref) in enumerate(zip(completions, refs, strict=True)):
        predicted = extract_answer(completion, ref.answer_format)
        equal = predicted is not None and answers_equal(predicted, ref.answer)
        scores.append(1.0 if equal else 0.0)
        if predicted is not None and not equal and _worth_verifying(predicted, ref.answer):
            pending.append((i, predicted, ref.answer))
    runs = MathRuns()
    pairs = [(p, r) for _, p, r in pending]
    verdicts = symbolic_verdicts(pairs, stats.isolation, runs, stats.workers)
    stats.runs += runs.runs
    stats.failures += runs.failures
    for (i, _, _), same in zip(pending, verdicts, strict=True):
        scores[i] = 1.0 if same else 0.0
    return scores


def extract_code(completion: str, answer_format: AnswerFormat = "tags") -> str:
    """The code in the answer tag (or the whole completion), without markdown fences."""
    tagged = answer_format in ("tags", "answer") and "<answer>" in completion
    text = extract_answer(completion) if tagged else completion
    fenced = _FENCE.search(text or "")
    return (fenced.group(1) if fenced else text or "").strip()


CODE_LIMITS = Limits(cpu_seconds=5, wall_seconds=15, memory_bytes=512 << 20)
CALL_SECONDS = 2.0  # CPU for each call of a test, and for the candidate's own top-level code
# What the parent accepts, in CPU seconds of the whole sandbox as the kernel counts them:
# starting (~0.03 s) and the top-level code, then each call; the margin covers starting and
# the parent reading a line a moment late (the in-sandbox alarm stops honest code at
# CALL_SECONDS of CPU; one that dodges it is judged by these numbers alone)
CODE_CPU = CpuLimits(start_seconds=CALL_SECONDS + 0.25, call_seconds=CALL_SECONDS + 0.25)


def _test_checks(tests: Sequence[str], stats: SandboxStats) -> list[list[Check] | None]:
    """The checks of each test; None (counted as ungradable) where its shape is not safe."""
    found: list[list[Check] | None] = []
    for test in tests:
        try:
            found.append(parse_test(test))
        except Ungradable:
            stats.ungradable += 1
            found.append(None)
    return found


def _score_tests(checks: list[list[Check] | None], result: SandboxResult | None) -> float:
    flat = [c for group in checks if group for c in group]
    if result is None:
        returned: list[tuple[bool, Any]] = []
    else:
        returned = read_results(result.stdout, len(flat), result.line_cpu, CODE_CPU)
    passed, position = 0, 0
    for group in checks:
        if not group:
            continue
        outcomes = returned[position : position + len(group)]
        position += len(group)
        passed += all(passes(c, *o) for c, o in zip(group, outcomes, strict=True))
    return passed / len(checks) if checks else 0.0


@reward("code_pass_rate", batch=True)
def code_pass_rate(
    completions: Sequence[str], refs: Sequence[Reference], stats: SandboxStats
) -> list[float]:
    """Fraction of the reference tests (MBPP, HumanEval) passed: the calls run sandboxed, one
    sandbox per completion (a pool of them at a time), the verdicts are decided here."""
    plans = [_test_checks(r.tests, stats) for r in refs]
    sources, owners = [], []
    for i, (completion, ref, checks) in enumerate(zip(completions, refs, plans, strict=True)):
        calls = [c.expression for group in checks if group for c in group]
        if calls:
            code = extract_code(completion, ref.answer_format)
            sources.append(harness(code, imports_of(ref.tests), calls, CALL_SECONDS))
            owners.append(i)
    results: list[SandboxResult | None] = [None] * len(completions)
    for i, result in zip(owners, run_sandboxed(sources, stats), strict=True):
        results[i] = result
    return [_score_tests(checks, result) for checks, result in zip(plans, results, strict=True)]


RANDOM_REWARD_SEED = 0
"""Salts the `random` reward's draws (a fixed number: the same draws in every run)."""


def random_draw(prompt: str, sample: int, seed: int = RANDOM_REWARD_SEED) -> float:
    """0.0 or 1.0 with even odds: the low bit of sha256(seed, prompt, sample index)."""
    digest = hashlib.sha256(f"{seed}\x00{sample}\x00{prompt}".encode()).digest()
    return float(digest[-1] & 1)


@reward("random", batch=True)
def random_reward(
    completions: Sequence[str], refs: Sequence[Reference], stats: SandboxStats
) -> list[float]:
    """The negative control: 0 or 1 with even odds, independent of the completion's text and
    of the answer. Each completion's draw is decided by its prompt and its index among the
    batch's completions of that prompt (its place in the group), so a run that resumes, given
    the same prompts in the same order, draws the same rewards bit for bit."""
    seen: dict[str, int] = {}
    out = []
    for ref in refs:
        index = seen.get(ref.prompt, 0)
        seen[ref.prompt] = index + 1
        out.append(random_draw(ref.prompt, index))
    return out


BUILTIN = frozenset(REGISTRY)
"""FAR's own rewards (registered above, as a plugin's are)."""


def get_reward(name: str) -> Reward:
    """The reward registered as `name`; UnknownReward names the registered ones."""
    found = REGISTRY.get(name)
    if found is None:
        close = difflib.get_close_matches(name, sorted(REGISTRY), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
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


def run_sandboxed(
    sources: Sequence[str], stats: SandboxStats, limits: Limits = CODE_LIMITS
) -> list[SandboxResult]:
    """Run each Python source (model-written code inside a harness) in its own sandbox, at the
    run's isolation level, counted in `stats`; never raises for what the code does (a crash or
    timeout is a result with ok False). The one way a reward may execute model output."""
    results = run_many(sources, limits, stats.isolation, stats.workers)
    stats.runs += len(results)
    stats.failures += sum(0 if r.ok else 1 for r in results)
    return results


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


def applicable_mean(values: Sequence[float | None]) -> float | None:
    """The mean of the values that apply (not None); None when none does."""
    found = [v for v in values if v is not None]
    return sum(found) / len(found) if found else None


def stats_for(ctx: RunContext) -> SandboxStats:
    """A stage's sandbox settings and its user rewards' call limit, from the run."""
    limit = CallLimit(ctx.reward_call_seconds, ctx.deadline, ctx.stop)
    return SandboxStats(ctx.sandbox_isolation, ctx.sandbox_workers, limit=limit)


def isolation_metrics(stats: SandboxStats) -> dict[str, float]:
    """The isolation level (1.0: bwrap, 0.0: process) and ungradable tests, as record metrics."""
    return {
        "sandbox_isolation_bwrap": 1.0 if stats.isolation == "bwrap" else 0.0,
        "sandbox_ungradable": float(stats.ungradable),
    }


class IsolationUnavailable(RuntimeError):
    """The recipe's sandbox isolation level cannot be had on this machine."""


def require_isolation(isolation: Isolation) -> None:
    """Refuse (before any stage starts) a run whose sandbox this machine cannot give."""
    missing = missing_isolation(isolation)
    if missing is not None:
        raise IsolationUnavailable(
            f"the recipe's rewards and evaluation run model-written code and math in a sandbox "
            f"with isolation {isolation!r}, which this machine cannot give: {missing}. Install "
            f"bubblewrap (make env does as root), or accept the weaker isolation explicitly "
            f"in the recipe with `sandbox: {{isolation: process}}` (a child interpreter that "
            f"model-written code can escape; for trusted models only)"
        )


TUNIX_REWARD = "far_reward"  # set on the callables below: a recipe reward's term, not the baseline


def tunix_reward_fns(
    weights: dict[str, float],
    stats: SandboxStats | None = None,
    answer_format: AnswerFormat = "tags",
) -> list[Callable[..., list[float]]]:
    """Batch callables in Tunix's shape: fn(prompts, completions, answer, tests, columns,
    **kw), grading in `answer_format` (the dataset's). Each returns its weighted scores, NaN
    where the reward does not apply (None), which Tunix's sum leaves out (nansum); a weighted
    score that is not finite (an overflow) is a RewardFailed naming the reward."""
    validate_names(weights)
    counted = stats if stats is not None else SandboxStats()
    fns = []
    for name, weight in weights.items():
        reward = get_reward(name)

        def batch_fn(
            prompts: Sequence[str],
            completions: Sequence[str],
            answer: Sequence[Any],
            tests: Sequence[Any] | None = None,
            columns: Sequence[Any] | None = None,
            _reward: Reward = reward,
            _weight: float = weight,
            **_: Any,
        ) -> list[float]:
            refs = references(answer, tests, answer_format, prompts, columns)
            scores = _reward.score(completions, refs, counted)
            return weighted(_reward, _weight, scores, completions)

        batch_fn.__name__ = name
        setattr(batch_fn, TUNIX_REWARD, True)
        fns.append(batch_fn)
    return fns


def weighted(
    reward: Reward, weight: float, scores: Scores, completions: Sequence[str]
) -> list[float]:
    """`weight` x each score (NaN where None); RewardFailed when a product is not finite."""
    out = []
    for i, score in enumerate(scores):
        value = math.nan if score is None else weight * score
        if score is not None and not math.isfinite(value):
            raise RewardFailed(
                f"reward {reward.name!r} ({reward.module}) scored {score!r} for completion {i} "
                f"{completion_text(completions[i])}, {value!r} at weight {weight:g}; "
                f"expected a finite weighted score: keep the reward's values in a sane range"
            )
        out.append(value)
    return out
