"""A decode step's matrix products with and without glibc's huge-page tunable, in one run.

Usage: .venv/bin/python -m bench.huge_pages [--pairs 2] [--reps 10] [--out FILE]

`far` restarts itself with `glibc.malloc.hugetlb=1` where the kernel advises huge pages only on
request (flows/launch.py). This measures what that buys: every weight product of a Gemma 3
270M decode step (the shapes `bench.bf16_matmul` lists) at 8 and 32 rows, in float32, in child
processes with the tunable at 0 and at 1, alternating A B, B A, so that a load that comes and
goes falls on both. The weights are made by XLA (`jax.random`), as a model's are: numpy
advises huge pages for its own large arrays, so weights that began as numpy arrays would hide
the difference. Prints and writes each child's step time and each pair's ratio, with the
kernel's policy and the C library (on an `always` or `never` kernel the arms are the same).

    flock /tmp/far-heavy.lock env JAX_PLATFORMS=cpu .venv/bin/python -m bench.huge_pages \\
        --out bench/results/huge-pages.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.bf16_matmul import decode_matrices, timed
from flows import launch

REPO = Path(__file__).resolve().parent.parent
ARMS = {"plain": "glibc.malloc.hugetlb=0", "huge pages": launch.HUGE_PAGES}


def last_json(tunable: str, module: str, *args: str) -> dict[str, Any]:
    """`python -m module args` in a fresh process whose glibc reads `tunable`: its last line."""
    env = {**os.environ, launch.TUNABLES: tunable, "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-m", module, *args]
    done = subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, text=True)
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found


def child(tunable: str, rows: list[int], reps: int) -> dict[int, float]:
    """`step_ms` in a fresh process: float32 ms a step, by rows."""
    found = last_json(
        tunable, "bench.huge_pages", "--child", "--reps", str(reps), "--rows", *map(str, rows)
    )
    return {int(k): v for k, v in found.items()}


def decode(tunable: str, prompts: int, tokens: int) -> dict[str, Any]:
    """bench.eval_batch_speedup in a fresh process: the real Gemma 3 270M decoding the demo's
    prompts greedily, 32 rows a step."""
    found = last_json(
        tunable,
        "bench.eval_batch_speedup",
        "--batches",
        "32",
        "--prompts",
        str(prompts),
        "--tokens",
        str(tokens),
    )
    return {
        "completions_per_s": found["completions_per_s"]["32"],
        "completions_sha256": found["completions_sha256"]["32"],
    }


def step_ms(rows: list[int], reps: int) -> dict[int, float]:
    """Median ms of each decode-step product, summed over a step, with XLA-made weights."""
    import jax

    matrices = decode_matrices(str(REPO / "recipes" / "demo.yaml"))
    product = jax.jit(lambda x, w: x @ w)
    out = {}
    for count in rows:
        total = 0.0
        for index, (k, n, per_step) in enumerate(matrices.values()):
            keys = jax.random.split(jax.random.key(index), 2)
            x = jax.random.normal(keys[0], (count, k))
            w = jax.random.normal(keys[1], (k, n)) * 0.02
            total += statistics.median(timed(product, x, w, reps)) * per_step
        out[count] = round(total * 1e3, 2)
    return out


def measure_arm(tunable: str, args: argparse.Namespace) -> dict[str, Any]:
    """One arm's products (float32 ms a step, by rows) and, with --decode-prompts, its decode."""
    found: dict[str, Any] = {"step_float32_ms": child(tunable, args.rows, args.reps)}
    if args.decode_prompts:
        found["decode"] = decode(tunable, args.decode_prompts, args.decode_tokens)
    return found


def pair_ratios(runs: list[dict[str, Any]], pairs: int, rows: list[int]) -> dict[str, list[float]]:
    """Per pair, plain / huge pages: each row count's step time, and decode's completions/s
    the other way up (huge / plain), so every ratio above 1 favours huge pages."""
    arm = {(r["pair"], r["arm"]): r for r in runs}
    ratios = {
        f"products_{n}_rows": [
            arm[p, "plain"]["step_float32_ms"][n] / arm[p, "huge pages"]["step_float32_ms"][n]
            for p in range(pairs)
        ]
        for n in rows
    }
    if "decode" in runs[0]:
        ratios["decode_completions_per_s"] = [
            arm[p, "huge pages"]["decode"]["completions_per_s"]
            / arm[p, "plain"]["decode"]["completions_per_s"]
            for p in range(pairs)
        ]
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2, help="A B then B A, this many times")
    parser.add_argument("--reps", type=int, default=10, help="timed products per matrix")
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32], help="decode rows")
    parser.add_argument(
        "--decode-prompts", type=int, default=0, help="also decode this many demo prompts"
    )
    parser.add_argument("--decode-tokens", type=int, default=64, help="new tokens a completion")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(step_ms(args.rows, args.reps)))
        return
    runs: list[dict[str, Any]] = []
    for pair in range(args.pairs):
        for arm in list(ARMS) if pair % 2 == 0 else list(reversed(ARMS)):
            runs.append({"pair": pair, "arm": arm, **measure_arm(ARMS[arm], args)})
            print(json.dumps(runs[-1]))
    ratios = pair_ratios(runs, args.pairs, args.rows)
    for name, each in ratios.items():
        print(f"{name}: {statistics.median(each):.2f}x for huge pages (pairs: {each})")
    if args.out:
        record = {
            "thp_policy": launch.thp_policy(),
            "libc": list(platform.libc_ver()),
            "load_average_after": os.getloadavg(),
            "runs": runs,
            "ratios_for_huge_pages": ratios,
        }
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
