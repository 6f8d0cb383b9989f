"""A run's total time with the base network and tokenizer built once (the run's SharedBuilds)
against every stage building its own (RunContext.shared None, the behaviour before sharing).

Each variant runs the recipe's whole pipeline (its DAG, node by node as the flow runs it,
without Prefect) in a new interpreter on its own storage root, like one `far run`; the
variants alternate within each repetition. The model cache and JAX's compilation cache
(under the model cache, as `far run` sets it) are shared, and one unmeasured run warms them
first (fewer steps, same shapes) unless --no-warmup.

    JAX_PLATFORMS=cpu .venv/bin/python -m bench.shared_weights --recipe demo --reps 1
    JAX_PLATFORMS=cpu .venv/bin/python -m bench.shared_weights --recipe smoke --reps 3

Prints per run: seconds per stage, the pipeline's seconds, the process's wall time (imports
included), how many times the base weights were built and the seconds spent building them;
then per repetition the ratio shared / own of the process wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WARMUP = (
    "sft.max_steps=2",
    "sft.checkpoint_every_steps=1",
    "grpo.max_steps=1",
    "grpo.checkpoint_every_steps=1",
)


def child(
    recipe_name: str, root: str, variant: str, cache_dir: str, assignments: list[str]
) -> None:
    """One run of the pipeline; prints one JSON line of timings."""
    started = time.perf_counter()
    from pipeline import nodes
    from pipeline.dag import build_dag, node_config
    from pipeline.recipes import load_recipe
    from stages.core.runner import RunContext
    from stages.core.shared import SharedBuilds
    from stages.modeling import compile_cache, models

    builds: list[float] = []
    build = models.build_base_model

    def timed_build(*args: Any) -> Any:
        t0 = time.perf_counter()
        network = build(*args)
        builds.append(time.perf_counter() - t0)
        return network

    models.build_base_model = timed_build  # type: ignore[assignment]  # the bench's own probe
    recipe = load_recipe(
        str(REPO / "recipes" / f"{recipe_name}.yaml"), {"storage_root": root}, assignments
    )
    shared = SharedBuilds() if variant == "shared" else None
    ctx = RunContext(root, recipe.name, cache_dir=cache_dir, shared=shared)
    compile_cache.enable(ctx.model_cache)  # as far run does: under the model cache
    outputs: dict[str, Any] = {}
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    for node in build_dag(recipe).nodes:
        inputs = {name: outputs[source] for name, source in node.inputs.items()}
        outcome = nodes.run_node(recipe, node, node_config(recipe, node), inputs, ctx)
        outputs[node.id], stages[node.id] = outcome.output, outcome.seconds
    pipeline = time.perf_counter() - t0
    line = {
        "variant": variant,
        "stages": {k: round(v, 2) for k, v in stages.items()},
        "pipeline": round(pipeline, 2),
        "process": round(time.perf_counter() - started, 2),
        "base_builds": len(builds),
        "build_seconds": round(sum(builds), 2),
    }
    print("RESULT " + json.dumps(line), flush=True)


def run_child(
    recipe: str, root: Path, variant: str, cache_dir: str, assignments: list[str]
) -> dict[str, Any]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "bench.shared_weights",
        "--child",
        recipe,
        str(root),
        variant,
        cache_dir,
    ]
    t0 = time.perf_counter()
    done = subprocess.run(
        [*command, *assignments], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{variant} run failed:\n{done.stderr[-4000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    result["wall"] = round(wall, 2)
    return result


def summarize(name: str, values: list[float]) -> str:
    return (
        f"{name:<34} median {statistics.median(values):8.3f}  "
        f"min {min(values):8.3f}  max {max(values):8.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smoke", help="recipes/<name>.yaml")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cache-dir", default=None, help="model cache (default ~/.cache/far)")
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument("assignments", nargs="*", help="recipe overrides KEY=VALUE")
    args = parser.parse_args()
    cache_dir = args.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "far")
    results: dict[str, list[dict[str, Any]]] = {"own": [], "shared": []}
    with tempfile.TemporaryDirectory(prefix="far-shared-") as tmp:
        if not args.no_warmup:
            short = [*args.assignments, *WARMUP]  # same shapes, so the same executables
            warm = run_child(args.recipe, Path(tmp) / "warmup", "shared", cache_dir, short)
            print(f"warm-up: {warm}", flush=True)
        for rep in range(args.reps):
            for variant in ("own", "shared") if rep % 2 == 0 else ("shared", "own"):
                root = Path(tmp) / f"r{rep}-{variant}"
                got = run_child(args.recipe, root, variant, cache_dir, args.assignments)
                results[variant].append(got)
                print(f"rep {rep} {variant}: {got}", flush=True)
    report(results)


def report(results: dict[str, list[dict[str, Any]]]) -> None:
    print(f"\n{os.getloadavg()=}")
    for variant in ("own", "shared"):
        runs = results[variant]
        print(f"{variant}: base builds per run {[r['base_builds'] for r in runs]}")
        for key in ("wall", "pipeline", "build_seconds"):
            print(summarize(f"  {key} seconds ({variant})", [r[key] for r in runs]))
    pairs = list(zip(results["shared"], results["own"], strict=True))
    print(summarize("shared / own, process wall time", [s["wall"] / o["wall"] for s, o in pairs]))
    print(summarize("shared / own, pipeline", [s["pipeline"] / o["pipeline"] for s, o in pairs]))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
    else:
        main()
