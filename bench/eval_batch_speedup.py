"""Greedy evaluation's completions per second at several batch sizes, on the same prompts.

Usage: .venv/bin/python -m bench.eval_batch_speedup [--recipe demo] [--batches 1 16]
           [--prompts 16] [--tokens 32] [--reps 1]

Every batch size is compiled first (a warm-up call each), then the sizes are timed in turns,
`--reps` rounds of all of them, in one process: the ratios are what this machine sees for the
same work, and a load that comes and goes falls on every size alike. Each size's greedy
outputs are compared with the first size's. Prints one JSON line.

Why: a decode step reads every weight whatever its rows (all of Gemma 3 270M's f32 bytes),
so below the compute bound more rows per step cost little (bench/results/roofline-demo.json:
decode with 8 rows ran at its memory bound, at about an eighth of the matmul peak). Every
evaluate node (headroom, validation, held out) decodes `eval.batch_size` rows a step.

    flock /tmp/far-heavy.lock env JAX_PLATFORMS=cpu .venv/bin/python -m bench.eval_batch_speedup \
        --recipe reinforce-mode --batches 32 64 128 --prompts 256 --reps 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

from pipeline.recipes import load_recipe
from stages.data_prep import build as data_prep
from stages.evaluate import evaluation as evaluate
from stages.modeling import models
from stages.modeling.tokenizers import build_tokenizer


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="demo", help="a recipe under recipes/, no .yaml")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompts", type=int, default=16, help="eval prompts to decode")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per completion")
    parser.add_argument("--reps", type=int, default=1, help="timed rounds of every size")
    parser.add_argument(
        "--cache-dir", default=os.environ.get("FAR_CACHE_DIR", os.path.expanduser("~/.cache/far"))
    )
    return parser.parse_args()


def main() -> None:
    args = arguments()
    recipe = load_recipe(f"recipes/{args.recipe}.yaml")
    tokenizer = build_tokenizer(recipe.model, args.cache_dir)
    mesh = models.build_mesh(recipe.mesh)
    network = models.build_base_model(recipe.model, mesh, args.cache_dir)
    splits = data_prep.build_splits(recipe.data, tokenizer, data_prep.Quarantine())
    prompts = [data_prep.chat_prompt(e.prompt) for e in splits["eval"][: args.prompts]]
    configs = {
        b: recipe.eval.model_copy(update={"batch_size": b, "max_generation_tokens": args.tokens})
        for b in args.batches
    }

    def generate(batch: int, some: list[str]) -> list[str]:
        return evaluate.generate(
            network, tokenizer, some, configs[batch], recipe.data.max_prompt_len, recipe.model
        )

    seconds: dict[int, float] = dict.fromkeys(args.batches, 0.0)
    outputs: dict[int, list[str]] = {}
    with mesh:
        for batch in args.batches:
            generate(batch, prompts[:batch])  # warm-up compile
        for _ in range(args.reps):
            for batch in args.batches:
                started = time.perf_counter()
                outputs[batch] = generate(batch, prompts)
                seconds[batch] += time.perf_counter() - started
    first = args.batches[0]
    per_s = {b: args.reps * len(prompts) / s for b, s in seconds.items()}
    print(
        json.dumps(
            {
                "recipe": args.recipe,
                "prompts": len(prompts),
                "new_tokens": args.tokens,
                "reps": args.reps,
                "load_average": os.getloadavg(),
                "completions_per_s": {b: round(v, 3) for b, v in per_s.items()},
                f"speedup_vs_batch{first}": {
                    b: round(v / per_s[first], 2) for b, v in per_s.items()
                },
                f"identical_to_batch{first}": {b: o == outputs[first] for b, o in outputs.items()},
                "completions_sha256": {
                    b: hashlib.sha256(json.dumps(o).encode()).hexdigest()
                    for b, o in outputs.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
