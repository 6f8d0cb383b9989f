"""How far grpo.sampler_projection: bfloat16 moves Gemma 3 270M's next-token distributions.

The bfloat16 vocabulary table (tunix_compat.attach_vocab_table) gives the rollout other logits,
so other sampled completions for a seed: a recipe choice whose change is stated, not hidden.
This greedy-decodes N held-out-style arithmetic prompts with the float32 sampler, then, on
those very sequences, compares at each completion position softmax(h @ E.T) with the softmax of
the bfloat16-operand product the sampler would use: the total variation distance (what a
sampled token's distribution moves by), whether the argmax agrees, the largest logit change;
and greedy completions decoded with the bfloat16 sampler against the float32 ones.

    JAX_PLATFORMS=cpu .venv/bin/python -m experiments.vocab_table_divergence \
        --out bench/results/vocab-table-divergence.json

The model is the base Gemma 3 270M with fresh LoRA adapters (B = 0: the base model's outputs),
in the reinforce-headroom recipe's prompt format.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parents[1]

from pipeline.recipes import load_recipe  # noqa: E402
from stages.modeling import fast_paths, generation, models, tunix_compat  # noqa: E402
from stages.modeling.tokenizers import build_tokenizer  # noqa: E402


def prompts(count: int) -> list[str]:
    import reasoning_gym

    data = reasoning_gym.create_dataset(
        "basic_arithmetic",
        size=count,
        seed=123,
        min_terms=2,
        max_terms=2,
        min_digits=1,
        max_digits=1,
        operators=["+", "-", "*"],
    )
    return [
        f"<start_of_turn>user\n{x['question']}<end_of_turn>\n<start_of_turn>model\n" for x in data
    ]


def position_divergence(hidden: Any, embedding: Any, valid: np.ndarray) -> dict[str, float]:
    """TV distance, argmax agreement and largest logit change, float32 vs bfloat16 operands."""
    tv: list[float] = []
    agree = total = 0
    largest = 0.0
    table = embedding.T.astype(jnp.bfloat16)
    for row in range(hidden.shape[0]):
        exact = jnp.dot(hidden[row], embedding.T)
        bf16 = jnp.dot(hidden[row].astype(jnp.bfloat16), table, preferred_element_type=jnp.float32)
        distance = 0.5 * jnp.abs(jax.nn.softmax(exact, -1) - jax.nn.softmax(bf16, -1)).sum(-1)
        keep = valid[row]
        tv += list(np.asarray(distance)[keep])
        same = np.asarray(exact.argmax(-1)) == np.asarray(bf16.argmax(-1))
        agree, total = agree + int(same[keep].sum()), total + int(keep.sum())
        largest = max(largest, float(jnp.abs(exact - bf16)[keep].max()))
    spread = np.asarray(tv)
    return {
        "positions": total,
        "tv_mean": float(spread.mean()),
        "tv_p99": float(np.quantile(spread, 0.99)),
        "tv_max": float(spread.max()),
        "argmax_agreement": agree / total,
        "max_abs_logit_change": largest,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--cache-dir", default="/tmp/w/model-cache")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from tunix.rl import common as rl_common

    recipe = load_recipe(str(REPO / "recipes" / "reinforce-headroom.yaml"))
    mesh = models.build_mesh(recipe.mesh)
    base = models.build_base_model(recipe.model, mesh, args.cache_dir)
    model = models.apply_lora(base, recipe.sft.lora, mesh)
    tokenizer = build_tokenizer(recipe.model, args.cache_dir)
    texts = prompts(args.prompts)
    # for the script's life, as the GRPO stage has them
    contextlib.ExitStack().enter_context(
        fast_paths.installed("prefill_last_position", "vocab_table")
    )
    kwargs: dict[str, Any] = {
        "max_generation_steps": args.tokens,
        "max_prompt_length": 64,
        "echo": False,
    }
    with mesh:
        exact = generation.build_sampler(model, tokenizer, recipe.model, 64, args.tokens)
        out = exact(input_strings=texts, pad_output=True, **kwargs)
        completions = jnp.asarray(np.asarray(out.tokens))
        pad = tokenizer.pad_id()
        tokens, positions, mask, _ = rl_common.process_ids(
            jnp.asarray(out.padded_prompt_tokens), completions, pad, tokenizer.eos_id()
        )
        model(
            tokens, positions=positions, cache=None, attention_mask=mask, output_hidden_states=True
        )
        hidden = tunix_compat._final_hidden(model)[:, -completions.shape[1] - 1 : -1]
        embedding = model.embedder.input_embedding.value
        result: dict[str, Any] = position_divergence(
            hidden, embedding, np.asarray(completions != pad)
        )
        tunix_compat.attach_vocab_table(model, "bfloat16")
        bf16 = generation.build_sampler(model, tokenizer, recipe.model, 64, args.tokens)
        bf16_texts = bf16(input_strings=texts, pad_output=True, **kwargs).text
    result["greedy_identical"] = sum(a == b for a, b in zip(out.text, bf16_texts, strict=True))
    result["prompts"] = len(texts)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
