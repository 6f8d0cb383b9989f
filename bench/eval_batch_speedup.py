"""Speedup of batched evaluation (batch 16) over batch size 1, on the same 16 prompts.

Usage: .venv/bin/python bench/eval_batch_speedup.py [--model demo|smoke] [--tokens 32]

Both shapes are compiled first (a warm-up call each), then timed in one process, so the
ratio is what this machine sees for the same work; it also checks that the greedy outputs
are identical. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from pipeline.recipes import load_recipe
from stages.data_prep import build as data_prep
from stages.evaluate import evaluation as evaluate
from stages.modeling import models
from stages.modeling.tokenizers import build_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo", choices=["demo", "smoke"])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument(
        "--cache-dir", default=os.environ.get("FAR_CACHE_DIR", os.path.expanduser("~/.cache/far"))
    )
    args = parser.parse_args()
    recipe = load_recipe(f"recipes/{args.model}.yaml")
    tokenizer = build_tokenizer(recipe.model, args.cache_dir)
    mesh = models.build_mesh(recipe.mesh)
    network = models.build_base_model(recipe.model, mesh, args.cache_dir)
    splits = data_prep.build_splits(recipe.data, tokenizer, data_prep.Quarantine())
    prompts = [data_prep.chat_prompt(e.prompt) for e in splits["eval"][:16]]
    timings, outputs = {}, {}
    with mesh:
        for batch in (1, 16):
            config = recipe.eval.model_copy(
                update={"batch_size": batch, "max_generation_tokens": args.tokens}
            )
            evaluate.generate(
                network,
                tokenizer,
                prompts[:batch],
                config,
                recipe.data.max_prompt_len,
                recipe.model,
            )  # warm-up compile
            started = time.perf_counter()
            outputs[batch] = evaluate.generate(
                network, tokenizer, prompts, config, recipe.data.max_prompt_len, recipe.model
            )
            timings[batch] = time.perf_counter() - started
    print(
        json.dumps(
            {
                "model": args.model,
                "prompts": len(prompts),
                "new_tokens": args.tokens,
                "seconds_batch1": round(timings[1], 2),
                "seconds_batch16": round(timings[16], 2),
                "speedup": round(timings[1] / timings[16], 2),
                "identical_outputs": outputs[1] == outputs[16],
            }
        )
    )


if __name__ == "__main__":
    main()
