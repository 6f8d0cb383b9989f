"""SFT useful-token fraction with and without packing, on a recipe's real data and tokenizer.

Why: an unpacked SFT row holds one example and padding, so on short examples most of every
step's compute trains on padding. This builds the recipe's SFT split exactly as data-prep
does (same sources, tokenizer, chat template) and packs it at the recipe's row length and at
longer ones, printing the share of token slots that hold a real token and the row count
(rows are what a step pays for). No timing: the numbers are a property of the data.

    JAX_PLATFORMS=cpu .venv/bin/python -m bench.packing --recipe demo
    JAX_PLATFORMS=cpu .venv/bin/python -m bench.packing --recipe smoke --lengths 512 1024
"""

from __future__ import annotations

import argparse
import os
import statistics

from pipeline.recipes import load_recipe
from stages.data_prep import build as data_prep
from stages.data_prep import packing
from stages.modeling.tokenizers import build_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="demo", help="recipes/<name>.yaml")
    parser.add_argument(
        "--lengths", type=int, nargs="*", default=[], help="row lengths besides the recipe's own"
    )
    parser.add_argument(
        "--cache-dir", default=os.environ.get("FAR_CACHE_DIR", os.path.expanduser("~/.cache/far"))
    )
    args = parser.parse_args()
    recipe = load_recipe(f"recipes/{args.recipe}.yaml")
    tokenizer = build_tokenizer(recipe.model, args.cache_dir)
    splits = data_prep.build_splits(recipe.data, tokenizer, data_prep.Quarantine())
    sequences = data_prep.tokenize_on_grain(splits["sft_train"], tokenizer)
    lengths = [len(tokens) for tokens, _ in sequences]
    print(
        f"{args.recipe}: {len(sequences)} SFT examples, tokens per example "
        f"median {statistics.median(lengths):.0f}, max {max(lengths)} "
        f"(tokenizer {tokenizer.name})"
    )
    print("row length | unpacked: fraction (rows) | packed: fraction (rows) | rows saved")
    for seq_len in sorted({recipe.data.max_seq_len, *args.lengths}):
        if seq_len < max(lengths):
            print(f"{seq_len:>10} | skipped: the longest example has {max(lengths)} tokens")
            continue
        plain = packing.pack_rows(sequences, seq_len, tokenizer.pad_id(), packing=False)
        packed = packing.pack_rows(sequences, seq_len, tokenizer.pad_id(), packing=True)
        rows_plain, rows_packed = len(plain["input_tokens"]), len(packed["input_tokens"])
        print(
            f"{seq_len:>10} | {packing.useful_fraction(plain):.3f} ({rows_plain})"
            f" | {packing.useful_fraction(packed):.3f} ({rows_packed})"
            f" | x{rows_plain / rows_packed:.2f}"
        )


if __name__ == "__main__":
    main()
