"""Batched text generation with Tunix's sampler at one compiled shape: the one sampling loop.

Stages that generate outside training (evaluation, self-teaching) share this: prompts are
padded to the dataset's prompt length, each batch filled to `batch_size` with repeats of its
last prompt (so one shape compiles once), and batch `n` samples with seed `seed + n`, so a
re-run draws the same completions. A BatchStore (evaluation's progress on storage) lets a
resumed session read back the batches an earlier one finished instead of generating them.

A batch decodes until its longest completion ends, so greedy evaluation batches prompts by
length (`by_length`): a prompt's length predicts its completion's, and like prompts stop
together. A greedy row is computed apart from the other rows of its batch, so the order
changes no completion; a sampled row's draws follow its batch's seed, so sampling keeps the
given order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tunix.generate import sampler as tunix_sampler

from schemas.recipe import ModelSpec
from stages.modeling import models, tunix_compat
from stages.modeling.tokenizers import Tokenizer


def build_sampler(
    network: Any, tokenizer: Tokenizer, spec: ModelSpec, prompt_len: int, max_tokens: int
) -> tunix_sampler.Sampler:
    """A sampler whose KV cache fits `prompt_len` prompt tokens plus `max_tokens`; reuse it
    across calls to compile each shape once. Its prefill projects only the last prompt
    position to the vocabulary where the stage installs the fast path "prefill_last_position"
    (stages/modeling/fast_paths.py, read by the Sampler when it is built: the same logits)."""
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


class BatchStore(Protocol):
    """Finished batches kept across sessions, and the check before generating another."""

    def load(self, number: int) -> list[str] | None:
        """Batch `number`'s completions if an earlier session finished it, else None."""

    def before_batch(self, number: int) -> None:
        """Raise (e.g. SessionExpired) when batch `number` must not start."""

    def save(self, number: int, completions: list[str]) -> None:
        """Keep batch `number`'s completions."""


def generate(
    sampler: tunix_sampler.Sampler | None,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    *,
    prompt_len: int,
    max_tokens: int,
    batch_size: int,
    temperature: float,
    seed: int,
    store: BatchStore | None = None,
    draw: str = "gumbel",
    by_length: bool = False,
) -> list[str]:
    """One completion per prompt, in the prompts' order; greedy when `temperature` is 0.
    Batch n uses seed + n; sampled tokens are drawn by `draw` (tunix_compat.set_draw: gumbel
    or inverse_cdf; a sampler keeps the draw it first sampled with, and refuses another).

    With `store`, the batches it holds are read back, each new one is saved as soon as it is
    done; `sampler` may be None when the store holds every batch. With `by_length`, batches
    are made of the prompts in `length_order` (the store numbers those batches).
    """
    if by_length and temperature:
        raise ValueError("by_length reorders batches, which moves a sampled prompt's draws")
    order = length_order(tokenizer, prompts) if by_length else list(range(len(prompts)))
    sampling = {"temperature": temperature, "top_p": 1.0} if temperature else {}
    out = [""] * len(prompts)
    for number, start in enumerate(range(0, len(order), batch_size)):
        indices = order[start : start + batch_size]
        texts = None if store is None else store.load(number)
        if texts is None:
            if store is not None:
                store.before_batch(number)
            if sampler is None:
                raise ValueError(
                    f"batch {number} is not stored and no sampler was given to make it"
                )
            texts = _decode(
                sampler,
                tokenizer,
                [prompts[i] for i in indices],
                batch_size=batch_size,
                prompt_len=prompt_len,
                max_tokens=max_tokens,
                seed=seed + number,
                sampling=sampling,
                draw=draw,
            )
            if store is not None:
                store.save(number, texts)
        for index, text in zip(indices, texts, strict=True):
            out[index] = text
    return out


def _decode(
    sampler: tunix_sampler.Sampler,
    tokenizer: Tokenizer,
    batch: list[str],
    *,
    batch_size: int,
    prompt_len: int,
    max_tokens: int,
    seed: int,
    sampling: dict[str, float],
    draw: str,
) -> list[str]:
    """One batch's completions, filled to `batch_size` with repeats of its last prompt."""
    padded = batch + [batch[-1]] * (batch_size - len(batch))
    tunix_compat.set_draw(sampler, draw)
    result = sampler(
        padded,
        max_generation_steps=max_tokens,
        max_prompt_length=prompt_len,
        seed=seed,
        eos_tokens=[tokenizer.eos_id(), tokenizer.end_of_turn_id()],
        **sampling,
    )
    return list(result.text[: len(batch)])


def length_order(tokenizer: Tokenizer, prompts: Sequence[str]) -> list[int]:
    """The prompts' indices by token count, shortest first; equal counts keep their order."""
    lengths = [len(tokenizer.encode(p)) for p in prompts]
    return sorted(range(len(prompts)), key=lengths.__getitem__)
