"""What drawing a sampled token costs in a decode step: Tunix 0.1.7's draw (Gumbel-max,
`jax.random.categorical`) against stages/modeling/sampling.py's inverse CDF.

Part 1 times the draw alone on [rows, vocabulary] logits (Gemma 3's 262,144 entries), with
the log-softmax Tunix adds for the log-probs, the greedy argmax and a flat cumulative sum
beside it. Part 2 (`--rollout`) runs the real Gemma 3 270M sampler of a recipe: rows x
tokens, sampled at temperature 1 with Tunix's draw, then with the inverse CDF (a second
sampler, through `generation.generate(draw="inverse_cdf")` as evaluate and self_teach call
it), then greedy; alternating, after one compiling call each. Every number is a median of one
run, on one machine, the arms interleaved.

    JAX_PLATFORMS=cpu .venv/bin/python -m bench.sampling_cost --rollout \\
        --out bench/results/sampling-cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parent.parent
VOCAB = 262_144


def median_ms(call: Callable[[], Any], reps: int) -> float:
    jax.block_until_ready(call())  # compile
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 2)


def draw_alone(rows: int, reps: int) -> dict[str, float]:
    from stages.modeling import sampling

    logits = jnp.asarray(np.random.default_rng(0).standard_normal((rows, VOCAB)), jnp.float32)
    key = jax.random.PRNGKey(0)
    programs = {
        "gumbel_max_ms": jax.jit(jax.random.categorical),
        "inverse_cdf_ms": jax.jit(sampling.inverse_cdf_categorical),
        "log_softmax_ms": jax.jit(lambda k, x: jax.nn.log_softmax(x, axis=-1)),
        "argmax_ms": jax.jit(lambda k, x: jnp.argmax(x, axis=-1)),
        # why sampling.py sums in two levels: one cumulative sum over the whole vocabulary
        "flat_cumsum_ms": jax.jit(lambda k, x: jnp.cumsum(x, axis=-1)),
    }
    return {name: median_ms(lambda f=f: f(key, logits), reps) for name, f in programs.items()}


def rollout(recipe_path: str, rows: int, tokens: int, reps: int, cache: str) -> dict[str, Any]:
    from pipeline.recipes import load_recipe
    from stages.modeling import generation, models
    from stages.modeling.tokenizers import build_tokenizer

    recipe = load_recipe(recipe_path)
    mesh = models.build_mesh(recipe.mesh)
    network = models.apply_lora(
        models.build_base_model(recipe.model, mesh, cache), recipe.sft.lora, mesh
    )
    tokenizer = build_tokenizer(recipe.model, cache)
    length = recipe.data.max_prompt_len
    prompts = [f"Calculate {i} + {3 * i - 7}." for i in range(rows)]

    def arm(temperature: float, draw: str) -> Callable[[int], None]:
        sampler = generation.build_sampler(network, tokenizer, recipe.model, length, tokens)

        def call(seed: int) -> None:
            with mesh:
                generation.generate(
                    sampler,
                    tokenizer,
                    prompts,
                    prompt_len=length,
                    max_tokens=tokens,
                    batch_size=rows,
                    temperature=temperature,
                    seed=seed,
                    draw=draw,
                )

        call(0)  # traced and compiled now, with its draw (generate passes it to the sampler)
        return call

    arms = {
        "gumbel_max_s": arm(1.0, "gumbel"),
        "inverse_cdf_s": arm(1.0, "inverse_cdf"),
        "greedy_s": arm(0.0, "gumbel"),
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    for rep in range(reps):
        for name, call in arms.items():
            start = time.perf_counter()
            call(rep + 1)
            times[name].append(time.perf_counter() - start)
    out: dict[str, Any] = {"rows": rows, "tokens": tokens, "recipe": recipe_path}
    out.update({name: round(statistics.median(t), 3) for name, t in times.items()})
    out["all_s"] = {name: [round(x, 3) for x in t] for name, t in times.items()}
    out["speedup"] = round(out["gumbel_max_s"] / out["inverse_cdf_s"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32], help="rows per draw")
    parser.add_argument("--reps", type=int, default=20, help="timed draws per program")
    parser.add_argument("--rollout", action="store_true", help="also time the real sampler")
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "demo.yaml"))
    parser.add_argument("--rollout-rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32, help="tokens a rollout generates")
    parser.add_argument("--rollout-reps", type=int, default=3)
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "far"))
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results: dict[str, Any] = {"draw": {}}
    for rows in args.rows:
        results["draw"][rows] = draw_alone(rows, args.reps)
        print(f"draw, {rows} rows x {VOCAB}: {results['draw'][rows]}", flush=True)
    if args.rollout:
        results["rollout"] = rollout(
            args.recipe, args.rollout_rows, args.tokens, args.rollout_reps, args.cache_dir
        )
        print(f"rollout: {results['rollout']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
