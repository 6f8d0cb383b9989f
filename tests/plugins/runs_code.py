"""A reward that runs model-written code: only through the sandbox (run_sandboxed)."""

from collections.abc import Sequence

from stages.rewards import Reference, SandboxStats, extract_code, reward, run_sandboxed


@reward("runs_cleanly", batch=True)
def runs_cleanly(
    completions: Sequence[str], refs: Sequence[Reference], stats: SandboxStats
) -> list[float]:
    """1.0 when the completion has code that runs to its end without an error, sandboxed."""
    codes = [extract_code(c) for c in completions]
    results = run_sandboxed(codes, stats)  # never exec, eval or import model output here
    return [1.0 if code and r.ok else 0.0 for code, r in zip(codes, results, strict=True)]
