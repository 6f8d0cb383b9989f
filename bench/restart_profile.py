"""Where the seconds before the first trained step go, for a fresh start and for a restart
after kill -9: a sampling profile of bench/restart.py's child (the smoke recipe's SFT).

A thread in the child samples the main thread's Python stack every few milliseconds and
appends it to a file (flushed, so it survives SIGKILL). The parent runs a fresh process until
checkpoint step 2 is committed, kills it, restarts it on the same storage until step 3 is
committed, and kills it again; both with the compilation cache warmed by one earlier process.
For each, it prints the seconds from launch to the first new step and how the samples taken
until then split between phases (the first phase of PHASES a frame of the sampled stack
matches).

    JAX_PLATFORMS=cpu .venv/bin/python -m bench.restart_profile [--reps 2]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import restart  # the same child, launch and step detection

INTERVAL = 0.01
CHILD = "bench.restart_profile"  # restart.launch runs this module's profiled child
# phase name -> substrings of "file:function" frames; a sample belongs to the first phase
# (in this order) that any frame of its stack matches
PHASES = (
    ("import", ("<frozen importlib._bootstrap",)),
    ("xla compile / load executable", ("compile_or_get_cached", "backend_compile")),
    ("orbax restore", ("maybe_restore",)),
    ("orbax save / wait", ("checkpoint_manager.py:save", "wait_until_finished", ":close")),
    ("jax tracing", ("jax/_src/interpreters/partial_eval", "jax/_src/pjit")),
    ("lora apply", ("qwix",)),
    ("base model build", ("dummy_model_creator", "build_base_model")),
    ("data stream", ("grain", "stages/sft.py:batches", "datasets.py")),
    ("far records", ("stages/core/runner.py", "stages/core/records.py", "stages/core/storage.py")),
)


def sampler(path: str) -> None:
    """Append the main thread's stack (outermost first) every INTERVAL seconds, forever."""
    main = threading.main_thread().ident
    out = open(path, "a", buffering=1)  # noqa: SIM115  # killed with SIGKILL anyway
    t0 = time.perf_counter()
    while True:
        frame = sys._current_frames().get(main)  # the sampling profiler's way
        if frame is not None:
            stack = []
            while frame is not None:
                stack.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
                frame = frame.f_back
            out.write(f"{time.perf_counter() - t0:.4f}\t" + "|".join(reversed(stack)) + "\n")
        time.sleep(INTERVAL)


def profiled_child(root: str, run: str, cache: str) -> None:
    path = os.path.join(root, f"{run}.{os.getpid()}.samples")
    threading.Thread(target=sampler, args=(path,), daemon=True).start()
    restart.child(root, run, cache)


def phase_of(stack: list[str]) -> str:
    for name, patterns in PHASES:
        if any(p in frame for frame in stack for p in patterns):
            return name
    return "other"


def split(path: Path, seconds: float) -> dict[str, float]:
    """Seconds per phase among the samples taken in the first `seconds` of the process."""
    counts: collections.Counter[str] = collections.Counter()
    lines = [line.split("\t") for line in path.read_text().splitlines() if "\t" in line]
    kept = [stack.split("|") for t, stack in lines if float(t) <= seconds]
    for stack in kept:
        counts[phase_of(stack)] += 1
    total = max(len(kept), 1)
    return {name: round(seconds * n / total, 2) for name, n in counts.most_common()}


def measure(root: Path, cache: str, run: str) -> dict[str, tuple[float, dict[str, float]]]:
    result = {}
    for kind, step in (("fresh", 1), ("restart", 3)):
        elapsed, _, proc = restart.time_to_step(root, run, cache, step, CHILD)
        if kind == "fresh":
            restart.time_to_step_wait(root, run, 2, proc)
        restart.kill(proc)
        samples = root / f"{run}.{proc.pid}.samples"  # type: ignore[attr-defined]
        result[kind] = (round(elapsed, 2), split(samples, elapsed))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="far-restart-profile-") as tmp:
        root, cache = Path(tmp) / "runs", str(Path(tmp) / "xla")
        _, _, warm = restart.time_to_step(root, "warmup", cache, 1, CHILD)
        restart.kill(warm)
        ratios = []
        for rep in range(args.reps):
            try:
                got = measure(root, cache, f"r{rep}")
            except RuntimeError as e:  # a sampled child can crash (SIGSEGV seen once): say so
                print(f"rep {rep} lost: {e}", flush=True)
                continue
            for kind, (elapsed, phases) in got.items():
                print(f"rep {rep} {kind:<8} {elapsed:6.2f} s to the first new step: {phases}")
            ratios.append(got["restart"][0] / got["fresh"][0])
            print(f"rep {rep} restart / fresh {ratios[-1]:.2f}", flush=True)
        if ratios:
            print(restart.summarize("restart / fresh", ratios))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        profiled_child(*sys.argv[2:5])
    else:
        main()
