"""Token rows of one fixed shape, with or without sequence packing.

Unpacked, each row holds one example and padding. Packed, several examples share a row
(first-fit over examples sorted by length, longest first): segment_ids number them 1, 2, ...
(0 is padding) and positions restart at 0 in each, so training can attend block-diagonally
and each example sees exactly what it would see alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pack_rows(
    sequences: Sequence[tuple[list[int], list[int]]], seq_len: int, pad_id: int, packing: bool
) -> dict[str, np.ndarray]:
    """[N, seq_len] arrays from (tokens, loss mask) pairs, each pair at most seq_len long."""
    for tokens, mask in sequences:
        if len(tokens) != len(mask) or len(tokens) > seq_len:
            raise ValueError(
                f"sequence of {len(tokens)} tokens (mask {len(mask)}) does not "
                f"fit seq_len {seq_len}"
            )
    rows = _bins(sequences, seq_len) if packing else [[i] for i in range(len(sequences))]
    out = {
        "input_tokens": np.full((len(rows), seq_len), pad_id, dtype=np.int32),
        "input_mask": np.zeros((len(rows), seq_len), dtype=np.int32),
        "segment_ids": np.zeros((len(rows), seq_len), dtype=np.int32),
        "positions": np.zeros((len(rows), seq_len), dtype=np.int32),
    }
    for r, members in enumerate(rows):
        start = 0
        for segment, index in enumerate(members, start=1):
            tokens, mask = sequences[index]
            end = start + len(tokens)
            out["input_tokens"][r, start:end] = tokens
            out["input_mask"][r, start:end] = mask
            out["segment_ids"][r, start:end] = segment
            out["positions"][r, start:end] = np.arange(len(tokens))
            start = end
    return out


def _bins(sequences: Sequence[tuple[list[int], list[int]]], seq_len: int) -> list[list[int]]:
    """First-fit decreasing: deterministic (stable sort), typically > 90% full rows."""
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i][0]))
    rows: list[list[int]] = []
    free: list[int] = []
    for index in order:
        length = len(sequences[index][0])
        for r, space in enumerate(free):
            if length <= space:
                rows[r].append(index)
                free[r] -= length
                break
        else:
            rows.append([index])
            free.append(seq_len - length)
    return rows


def useful_fraction(arrays: dict[str, np.ndarray]) -> float:
    """Share of token slots that hold a real token (not padding)."""
    segments = arrays["segment_ids"]
    return float((segments > 0).mean()) if segments.size else 0.0
