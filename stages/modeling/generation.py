"""Batched text generation with Tunix's sampler at one compiled shape.

Stages that generate outside training (evaluation, self-teaching) share this: prompts are
padded to the dataset's prompt length, each batch filled to `batch_size` with repeats of its
last prompt (so one shape compiles once), and batch `n` samples with seed `seed + n`, so a
re-run draws the same completions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tunix.generate import sampler as tunix_sampler

from schemas.recipe import ModelSpec
from stages.modeling import models
from stages.modeling.tokenizers import Tokenizer


def build_sampler(
    network: Any, tokenizer: Tokenizer, spec: ModelSpec, prompt_len: int, max_tokens: int
) -> tunix_sampler.Sampler:
    """A sampler whose KV cache fits `prompt_len` prompt tokens plus `max_tokens`; reuse it
    across calls to compile each shape once."""
    arch = models.tunix_config(spec)
    return tunix_sampler.Sampler(
        network,
        tokenizer,
        tunix_sampler.CacheConfig(
            cache_size=prompt_len + max_tokens + 8,
            num_layers=arch.num_layers,
            num_kv_heads=arch.num_kv_heads,
            head_dim=arch.head_dim,
        ),
    )


def generate(
    sampler: tunix_sampler.Sampler,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    *,
    prompt_len: int,
    max_tokens: int,
    batch_size: int,
    temperature: float,
    seed: int,
) -> list[str]:
    """One completion per prompt; greedy when `temperature` is 0. Batch n uses seed + n."""
    sampling = {"temperature": temperature, "top_p": 1.0} if temperature else {}
    out: list[str] = []
    for number, start in enumerate(range(0, len(prompts), batch_size)):
        batch = list(prompts[start : start + batch_size])
        padded = batch + [batch[-1]] * (batch_size - len(batch))
        result = sampler(
            padded,
            max_generation_steps=max_tokens,
            max_prompt_length=prompt_len,
            seed=seed + number,
            eos_tokens=[tokenizer.eos_id(), tokenizer.end_of_turn_id()],
            **sampling,
        )
        out.extend(result.text[: len(batch)])
    return out
