"""Time from process start to the first trained step: fresh start vs restart after kill -9,
with and without JAX's persistent compilation cache (stages/modeling/compile_cache.py).

Each measured process runs the SFT stage of the smoke recipe (checkpoint every step) in a
new interpreter; the parent times from just before it starts the process to the moment the
first new checkpoint step is committed (for a fresh start step 1; for a restart, the step
after the one it resumes from). A fresh run is killed with SIGKILL once step 2 is committed,
then restarted on the same storage. The cache modes alternate within each repetition; the
cache directory is warmed by one unmeasured process first, so "fresh" is a warm fresh start
(OS file cache, converted weights, compiled executables all present).

    JAX_PLATFORMS=cpu .venv/bin/python -m bench.restart [--reps 3]

Prints per mode: seconds to the first step (median, min, max), the share of it spent in XLA
compilation (or loading compiled executables), and the ratios restart/fresh and cache/no cache.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def child(root: str, run: str, cache: str) -> None:
    """One process: data_prep (skipped once done) then SFT, printing compile seconds."""
    import jax

    from stages import sft
    from stages.core.runner import RunContext
    from stages.data_prep import build as data_prep
    from stages.modeling import compile_cache
    from tests.conftest import recipe_with

    if cache != "off":
        compile_cache.enable(cache)
    total = [0.0]
    log = open(f"{root}/{run}.compile", "a")  # noqa: SIM115  # killed with SIGKILL anyway

    def on_compile(event: str, duration: float, **_: object) -> None:
        if event == COMPILE_EVENT:
            total[0] += duration
            log.write(f"{os.getpid()} {total[0]:.4f}\n")
            log.flush()

    jax.monitoring.register_event_duration_secs_listener(on_compile)  # type: ignore[arg-type]
    recipe = recipe_with(root, sft={"max_steps": 10_000, "checkpoint_every_steps": 1})
    data = data_prep.prepare(recipe.data, recipe.model, RunContext(root=root, run="data"))
    sft.train(data.output, recipe.sft, recipe.model, recipe.mesh, RunContext(root=root, run=run))


def launch(root: Path, run: str, cache: str, module: str) -> subprocess.Popen[bytes]:
    """`python -m module --child ...` from the repository root: `module`'s child."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", module, "--child", str(root), run, cache]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def time_to_step(
    root: Path, run: str, cache: str, step: int, module: str = "bench.restart"
) -> tuple[float, float, object]:
    """(seconds from launch to checkpoint `step` committed, compile seconds, the process);
    `module` is the benchmark whose `--child` runs (bench.restart_profile samples its stack)."""
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    proc = launch(root, run, cache, module)
    while not list((root / run).glob(f"sft-*/checkpoints/{step}/_CHECKPOINT_METADATA")):
        if proc.poll() is not None:
            raise RuntimeError(f"child exited with {proc.returncode}")
        time.sleep(0.02)
    elapsed = time.perf_counter() - started
    log = root / f"{run}.compile"
    mine = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    seconds = [float(total) for pid, total in mine if int(pid) == proc.pid]
    return elapsed, (seconds[-1] if seconds else 0.0), proc


def kill(proc: object) -> None:
    proc.kill()  # type: ignore[attr-defined]  # SIGKILL: no clean save, like a lost VM
    proc.wait()  # type: ignore[attr-defined]


def one_repetition(root: Path, cache: str, rep: int) -> dict[str, tuple[float, float]]:
    run = f"r{rep}-{'cache' if cache != 'off' else 'nocache'}"
    fresh, fresh_compile, proc = time_to_step(root, run, cache, 1)
    time_to_step_wait(root, run, 2, proc)
    kill(proc)
    restart, restart_compile, proc = time_to_step(root, run, cache, 3)
    kill(proc)
    return {"fresh": (fresh, fresh_compile), "restart": (restart, restart_compile)}


def time_to_step_wait(root: Path, run: str, step: int, proc: object) -> None:
    while not list((root / run).glob(f"sft-*/checkpoints/{step}/_CHECKPOINT_METADATA")):
        if proc.poll() is not None:  # type: ignore[attr-defined]
            raise RuntimeError("child exited before step 2")
        time.sleep(0.02)


def summarize(name: str, values: list[float]) -> str:
    return (
        f"{name:<26} median {statistics.median(values):7.2f}  "
        f"min {min(values):7.2f}  max {max(values):7.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="far-restart-") as tmp:
        root, cache = Path(tmp) / "runs", str(Path(tmp) / "xla")
        _, _, warm = time_to_step(root, "warmup", cache, 1)  # fills the data and the cache
        kill(warm)
        results: dict[str, dict[str, list[tuple[float, float]]]] = {"cache": {}, "off": {}}
        for rep in range(args.reps):
            for mode in ("cache", "off") if rep % 2 == 0 else ("off", "cache"):
                got = one_repetition(root, cache if mode == "cache" else "off", rep)
                for kind, value in got.items():
                    results[mode].setdefault(kind, []).append(value)
                print(f"rep {rep} {mode}: {got}", flush=True)
        report(results)


def report(results: dict[str, dict[str, list[tuple[float, float]]]]) -> None:
    print(f"\nseconds from process start to the first trained step ({os.getloadavg()=})")
    for mode in ("cache", "off"):
        for kind in ("fresh", "restart"):
            pairs = results[mode][kind]
            print(summarize(f"{kind} ({mode})", [t for t, _ in pairs]))
            print(summarize(f"  compile share ({mode})", [c / t for t, c in pairs]))
    ratios = {
        "restart/fresh, cache": ("cache", "restart", "cache", "fresh"),
        "restart/fresh, no cache": ("off", "restart", "off", "fresh"),
        "cache/no cache, fresh": ("cache", "fresh", "off", "fresh"),
        "cache/no cache, restart": ("cache", "restart", "off", "restart"),
    }
    print("\nratios per repetition")
    for name, (m1, k1, m2, k2) in ratios.items():
        values = [a[0] / b[0] for a, b in zip(results[m1][k1], results[m2][k2], strict=True)]
        print(summarize(name, values))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
    else:
        main()
