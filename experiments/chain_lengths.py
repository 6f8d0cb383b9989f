"""What a worked chain costs in tokens: SFT target lengths with and without
`reasoning: steps`, on a recipe's own sft source, tokenizer and prompt format.

The target is what SFT trains on: the reasoning-and-answer text, its end-of-turn marker and
EOS (stages/data_prep/build.py sft_sequence); a completion is the target less the EOS, and the
recipe's eval.max_generation_tokens must fit it. The sequence is BOS,
prompt and target, which `data.max_seq_len` bounds. Rows are generated as the recipe's data
seed draws them (duplicates included), nothing is trained.

    python -m experiments.chain_lengths recipes/reinforce-mode.yaml --rows 2000
    python -m experiments.chain_lengths recipes/reinforce-generalize.yaml --rows 1010 \
        --arg min_terms=5 --arg max_terms=5 --budget 80
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np

from pipeline.recipes import load_recipe
from schemas.recipe import SourceSpec
from stages.data_prep.adapters import BadRow, Example
from stages.data_prep.build import chat_prompt, format_target
from stages.data_prep.columns import row_reader
from stages.data_prep.sources import read_rows, source_label
from stages.modeling.tokenizers import Tokenizer, build_tokenizer


def spread(values: list[int]) -> dict[str, float]:
    return {
        "median": float(np.median(values)),
        "p95": float(np.percentile(values, 95)),
        "max": float(max(values)),
    }


def lengths(
    examples: list[Example], tokenizer: Tokenizer, prompt: Any, budget: int
) -> dict[str, Any]:
    """Target and sequence lengths, and the share of completions (the target up to its
    end-of-turn marker: the EOS is never generated) longer than a generation `budget`."""
    targets, sequences = [], []
    for e in examples:
        target = len(tokenizer.encode(format_target(e.reasoning, e.answer, prompt))) + 1  # EOS
        head = 1 + len(tokenizer.encode(chat_prompt(e.prompt, prompt, tokenizer)))  # BOS
        targets.append(target)
        sequences.append(head + target)
    over = sum(t - 1 > budget for t in targets) / len(targets)
    return {
        "target_tokens": spread(targets),
        "sequence_tokens": spread(sequences),
        f"completions_over_{budget}_tokens": over,
    }


def _step_counts(rows: list[Example]) -> dict[int, int]:
    """{steps in a chain: rows} (a chain's steps each end in '.')."""
    counts: dict[int, int] = {}
    for row in rows:
        counts[row.reasoning.count(".")] = counts.get(row.reasoning.count("."), 0) + 1
    return dict(sorted(counts.items()))


def examples(spec: SourceSpec, seed: int) -> tuple[list[Example], int]:
    """(the usable examples, the rows quarantined) of one source read as data_prep reads it."""
    adapter, label, out, bad = row_reader(spec), source_label(spec), [], 0
    for row in read_rows(spec, seed):
        try:
            if isinstance(row, BadRow):
                raise row
            out.append(adapter(row, label))
        except BadRow:
            bad += 1
    return out, bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="KEY=INT",
        help="replace one of the generator's integer args, e.g. --arg max_terms=3",
    )
    parser.add_argument("--cache-dir", default=None, help="the model cache (default ~/.cache/far)")
    parser.add_argument(
        "--budget", type=int, default=None, help="the generation budget (default eval's)"
    )
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    cache = args.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "far")
    tokenizer = build_tokenizer(recipe.model, cache)
    budget = args.budget or recipe.eval.max_generation_tokens
    source = recipe.data.sft.sources[0]
    changed = {key: int(value) for key, value in (a.split("=", 1) for a in args.arg)}
    source = source.model_copy(update={"size": args.rows, "args": {**source.args, **changed}})
    report: dict[str, Any] = {
        "recipe": args.recipe,
        "rows": args.rows,
        "seed": recipe.data.seed,
        "args": source.args,
    }
    for style in ("given", "steps"):
        rows, bad = examples(source.model_copy(update={"reasoning": style}), recipe.data.seed)
        report[style] = {
            "quarantined": bad,
            "example": rows[0].reasoning,
            "steps": _step_counts(rows) if style == "steps" else None,
            **lengths(rows, tokenizer, recipe.data.prompt, budget),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
