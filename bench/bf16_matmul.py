"""Whether bfloat16 weights would speed up a Gemma 3 270M decode step on this CPU: every
matrix product of one decode step (18 layers' q, k, v, o, gate, up and down, and the tied
vocabulary projection), timed with float32 and with bfloat16 operands (float32 accumulation,
as a bf16 sampler would run them), interleaved in one process.

Decode reads every weight once per step, so at a few rows it is bound by memory: bfloat16
halves the bytes. This measures the ceiling of "bf16 sampler weights" as a lever, apart from
any sampler. Shapes come from the recipe's model.

    JAX_PLATFORMS=cpu .venv/bin/python -m bench.bf16_matmul \
        --out bench/results/bf16-matmul.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pipeline.recipes import load_recipe
from stages.modeling import models

REPO = Path(__file__).resolve().parent.parent


def decode_matrices(recipe_path: str) -> dict[str, tuple[int, int, int]]:
    """(input, output, count per decode step) of each weight matrix of the recipe's model."""
    arch = models.tunix_config(load_recipe(recipe_path).model)
    embed, heads, kv, head_dim = arch.embed_dim, arch.num_heads, arch.num_kv_heads, arch.head_dim
    layers = arch.num_layers
    return {
        "q": (embed, heads * head_dim, layers),
        "k": (embed, kv * head_dim, layers),
        "v": (embed, kv * head_dim, layers),
        "o": (heads * head_dim, embed, layers),
        "gate": (embed, arch.hidden_dim, layers),
        "up": (embed, arch.hidden_dim, layers),
        "down": (arch.hidden_dim, embed, layers),
        "vocab projection": (embed, arch.num_embed, 1),
    }


def seconds(rows: int, k: int, n: int, dtype: Any, reps: int) -> list[float]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((rows, k)), dtype)
    w = jnp.asarray(rng.standard_normal((k, n)) * 0.02, dtype)
    product = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
    return timed(product, x, w, reps)


def timed(product: Any, x: Any, w: Any, reps: int) -> list[float]:
    """Seconds of `reps` calls of the jitted `product(x, w)`, after one that compiles it."""
    product(x, w).block_until_ready()  # compile
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        product(x, w).block_until_ready()
        times.append(time.perf_counter() - start)
    return times


def measure(rows: int, matrices: dict[str, tuple[int, int, int]], reps: int) -> dict[str, Any]:
    """Median seconds per product, f32 and bf16 alternating per matrix; a step's sums."""
    out: dict[str, Any] = {"rows": rows, "matrices": {}}
    step = {"float32": 0.0, "bfloat16": 0.0}
    for name, (k, n, count) in matrices.items():
        f32 = statistics.median(seconds(rows, k, n, jnp.float32, reps))
        bf16 = statistics.median(seconds(rows, k, n, jnp.bfloat16, reps))
        out["matrices"][name] = {
            "shape": [k, n],
            "per_step": count,
            "float32_ms": round(f32 * 1e3, 4),
            "bfloat16_ms": round(bf16 * 1e3, 4),
            "speedup": round(f32 / bf16, 3),
        }
        step["float32"] += f32 * count
        step["bfloat16"] += bf16 * count
    out["step_float32_ms"] = round(step["float32"] * 1e3, 2)
    out["step_bfloat16_ms"] = round(step["bfloat16"] * 1e3, 2)
    out["step_speedup"] = round(step["float32"] / step["bfloat16"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "demo.yaml"))
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32], help="decode rows")
    parser.add_argument("--reps", type=int, default=30, help="timed products per matrix")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    matrices = decode_matrices(args.recipe)
    results = [measure(rows, matrices, args.reps) for rows in args.rows]
    for r in results:
        print(
            f"rows {r['rows']}: a decode step's products {r['step_float32_ms']} ms in f32, "
            f"{r['step_bfloat16_ms']} ms in bf16 ({r['step_speedup']}x)"
        )
        for name, m in r["matrices"].items():
            print(
                f"  {name:17s} {m['shape']} x{m['per_step']}: f32 {m['float32_ms']} ms, "
                f"bf16 {m['bfloat16_ms']} ms ({m['speedup']}x)"
            )
    if args.out:
        Path(args.out).write_text(json.dumps({"recipe": args.recipe, "results": results}, indent=1))


if __name__ == "__main__":
    main()
