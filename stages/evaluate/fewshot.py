"""Few-shot prompts for evaluating a base model: worked examples from the SFT training split.

A pretrained model has never seen FAR's reasoning/answer tag format, so zero-shot it scores
0 by construction; lm-eval-harness and the Gemma model cards evaluate base models few-shot.
The examples come from the SFT training split (the evaluation prompts are never shown), as
the same chat turns and targets SFT trains on. Pure functions: arrays in, token ids out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np


def worked_examples(arrays: dict[str, np.ndarray], k: int) -> list[tuple[list[int], list[int]]]:
    """The first `k` SFT examples as (prompt ids, target ids), in the split's order.

    An example is one segment of a row (packed rows hold several); its prompt is where the
    loss mask is 0, its target where it is 1. Segment id 0 is padding."""
    found: list[tuple[list[int], list[int]]] = []
    tokens, mask, segments = (arrays[n] for n in ("input_tokens", "input_mask", "segment_ids"))
    for row in range(tokens.shape[0]):
        for segment in sorted(set(segments[row].tolist()) - {0}):
            where = segments[row] == segment
            ids, loss = tokens[row][where].tolist(), mask[row][where].tolist()
            pairs = list(zip(ids, loss, strict=True))
            found.append(([t for t, m in pairs if not m], [t for t, m in pairs if m]))
            if len(found) == k:
                return found
    if len(found) < k:
        raise ValueError(f"the SFT split holds {len(found)} examples, eval asks for {k} shots")
    return found


def few_shot_prompt(shots: list[str], prompt: str) -> str:
    """The worked examples' chat turns, then the evaluation prompt."""
    return "".join(shots) + prompt


def shot_text(
    example: tuple[list[int], list[int]],
    decode: Callable[[list[int]], str],
    drop: Collection[int],
) -> str:
    """One worked example as text: its prompt and target turns without BOS/EOS/padding."""
    text = decode([t for t in [*example[0], *example[1]] if t not in drop])
    return text if text.endswith("\n") else text + "\n"
