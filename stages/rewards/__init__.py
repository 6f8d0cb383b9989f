"""Rewards: typed functions registered by name, shared by GRPO (as rewards) and evaluation
(as metrics).

Each reward scores a batch of completions against their references (answer and, for code,
tests). Pure ones are plain functions of one pair; the verifiers that must execute untrusted
text, math-verify on model-written math (stages/rewards/math_grading.py) and MBPP/HumanEval
tests on model-written code (stages/rewards/code_tests.py), run in the sandbox
(stages/rewards/sandbox.py, through `run_sandboxed`). The sandbox only computes; every verdict
is decided here from plain data, and a crash, refusal or timeout scores 0 and is counted,
never raised.

The package's modules, one idea each: `registry` (names, the three forms adapted to one
batch shape, a user's reward guarded and fingerprinted), `builtin` (FAR's own rewards),
`references` (what a completion is scored against), `sandboxing` (the sandbox's settings,
counters and `run_sandboxed`), `tunix_fns` (weighted batch callables for GRPO). This module
exports the names reward authors and stages use.

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

from stages.rewards.builtin import (  # FAR's own rewards register on import
    RANDOM_REWARD_SEED,
    answer_match,
    answers_equal,
    code_pass_rate,
    extract_code,
    format_approx,
    format_strict,
    math_equivalent,
    random_draw,
    random_reward,
    reasoning_quality,
)
from stages.rewards.guard import BadRewardSignature, RewardFailed, completion_text
from stages.rewards.references import Reference, references, row_references
from stages.rewards.registry import (
    REGISTRY,
    RESERVED,
    DuplicateReward,
    Reward,
    Scores,
    UnknownReward,
    applicable_mean,
    batch_columns,
    get_reward,
    register_reward,
    reward,
    reward_sources,
    unregister_reward,
    validate_names,
)
from stages.rewards.sandboxing import (
    IsolationUnavailable,
    SandboxStats,
    isolation_metrics,
    require_isolation,
    run_sandboxed,
    stats_for,
)
from stages.rewards.tunix_fns import TUNIX_REWARD, tunix_reward_fns, weighted

BUILTIN = frozenset(REGISTRY)
"""FAR's own rewards (registered by stages.rewards.builtin, as a plugin's are)."""

__all__ = [
    "BUILTIN",
    "RANDOM_REWARD_SEED",
    "REGISTRY",
    "RESERVED",
    "TUNIX_REWARD",
    "BadRewardSignature",
    "DuplicateReward",
    "IsolationUnavailable",
    "Reference",
    "Reward",
    "RewardFailed",
    "SandboxStats",
    "Scores",
    "UnknownReward",
    "answer_match",
    "answers_equal",
    "applicable_mean",
    "batch_columns",
    "code_pass_rate",
    "completion_text",
    "extract_code",
    "format_approx",
    "format_strict",
    "get_reward",
    "isolation_metrics",
    "math_equivalent",
    "random_draw",
    "random_reward",
    "reasoning_quality",
    "references",
    "register_reward",
    "require_isolation",
    "reward",
    "reward_sources",
    "row_references",
    "run_sandboxed",
    "stats_for",
    "tunix_reward_fns",
    "unregister_reward",
    "validate_names",
    "weighted",
]
