"""Packing: segments never attend to each other, positions restart, loss masks stay put."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from stages.data_prep.packing import pack_rows, useful_fraction
from stages.sft import segment_attention_mask

SEQS = [([1, 2, 3, 4], [0, 0, 1, 1]), ([5, 6], [0, 1]), ([7, 8, 9], [0, 1, 1]), ([10], [1])]


def test_unpacked_rows_hold_one_example_each() -> None:
    arrays = pack_rows(SEQS, seq_len=5, pad_id=0, packing=False)
    assert arrays["input_tokens"].shape == (4, 5)
    assert arrays["input_tokens"][1].tolist() == [5, 6, 0, 0, 0]
    assert arrays["segment_ids"][1].tolist() == [1, 1, 0, 0, 0]
    assert useful_fraction(arrays) == pytest.approx(10 / 20)


def test_packed_rows_keep_every_token_mask_and_restart_positions() -> None:
    arrays = pack_rows(SEQS, seq_len=5, pad_id=0, packing=True)
    assert arrays["input_tokens"].shape[0] < len(SEQS)
    recovered = []
    for r in range(arrays["input_tokens"].shape[0]):
        segments = arrays["segment_ids"][r]
        for s in range(1, int(segments.max()) + 1):
            where = np.flatnonzero(segments == s)
            assert (np.diff(where) == 1).all()  # contiguous
            assert arrays["positions"][r, where].tolist() == list(range(len(where)))
            recovered.append(
                (arrays["input_tokens"][r, where].tolist(), arrays["input_mask"][r, where].tolist())
            )
        assert (arrays["input_tokens"][r][segments == 0] == 0).all()
        assert (arrays["input_mask"][r][segments == 0] == 0).all()
    assert sorted(recovered) == sorted(SEQS)
    assert useful_fraction(arrays) == pytest.approx(10 / (5 * arrays["input_tokens"].shape[0]))


def test_no_token_attends_across_segments_or_to_padding() -> None:
    arrays = pack_rows(SEQS, seq_len=6, pad_id=0, packing=True)
    segments = arrays["segment_ids"]
    mask = np.asarray(segment_attention_mask(jnp.asarray(segments)))
    for r in range(segments.shape[0]):
        for i in range(segments.shape[1]):
            for j in range(segments.shape[1]):
                allowed = j <= i and segments[r, i] == segments[r, j] != 0
                assert mask[r, i, j] == allowed, (r, i, j)


def test_oversize_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit seq_len 3"):
        pack_rows([([1, 2, 3, 4], [0, 1, 1, 1])], seq_len=3, pad_id=0, packing=True)


def test_packing_is_deterministic() -> None:
    a = pack_rows(SEQS, seq_len=5, pad_id=0, packing=True)
    b = pack_rows(SEQS, seq_len=5, pad_id=0, packing=True)
    assert all((a[k] == b[k]).all() for k in a)
