"""How rewards use the sandbox (stages/rewards/sandbox.py runs it): a stage's isolation level
and pool size, the counters of what its sandboxed verifications did, the one way a reward
executes model output (`run_sandboxed`), and the refusal of a run whose isolation this machine
cannot give. A crash, refusal or timeout scores 0 and is counted here, never raised."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from stages.core.runner import RunContext
from stages.rewards.confinement import Isolation, Limits
from stages.rewards.guard import CallLimit
from stages.rewards.sandbox import SandboxResult, missing_isolation, run_many


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


CODE_LIMITS = Limits(cpu_seconds=5, wall_seconds=15, memory_bytes=512 << 20)


def run_sandboxed(
    sources: Sequence[str], stats: SandboxStats, limits: Limits | None = None
) -> list[SandboxResult]:
    """Run each Python source (model-written code inside a harness) in its own sandbox, at the
    run's isolation level, counted in `stats`, under `limits` (default CODE_LIMITS); never
    raises for what the code does (a crash or timeout is a result with ok False). The one way
    a reward may execute model output."""
    results = run_many(sources, limits or CODE_LIMITS, stats.isolation, stats.workers)
    stats.runs += len(results)
    stats.failures += sum(0 if r.ok else 1 for r in results)
    return results


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
