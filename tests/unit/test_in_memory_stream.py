"""The training stages' batch stream reads on the caller's thread, in grain's own order."""

from __future__ import annotations

import itertools
import threading

import numpy as np

from stages import sft
from stages.core.datasets import in_memory_stream


def arrays(rows: int = 12) -> dict[str, np.ndarray]:
    tokens = np.arange(rows * 4, dtype=np.int32).reshape(rows, 4)
    return {
        "input_tokens": tokens,
        "input_mask": np.ones_like(tokens),
        "positions": np.tile(np.arange(4, dtype=np.int32), (rows, 1)),
        "segment_ids": np.ones_like(tokens),
    }


def prefetch_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("grain-prefetch")]


def first_tokens(stream: object, count: int) -> list[list[int]]:
    return [b["input_tokens"][:, 0].tolist() for b in itertools.islice(stream, count)]  # type: ignore[call-overload]


def test_the_stream_yields_grains_batches_in_grains_order_across_epochs() -> None:
    dataset = sft.batches(arrays(), batch_size=4, seed=3)
    expected = [dataset[i]["input_tokens"][:, 0].tolist() for i in range(7)]  # 2+ epochs
    assert first_tokens(in_memory_stream(dataset), 7) == expected
    assert expected[0] != expected[3]  # epochs are shuffled differently


def test_the_stream_starts_no_reader_threads_where_grains_default_iterator_does() -> None:
    dataset = sft.batches(arrays(), batch_size=4, seed=0)
    before = prefetch_threads()
    first_tokens(in_memory_stream(dataset), 3)
    assert prefetch_threads() == before
    default = iter(dataset)  # the control: grain's default reads ahead on its own threads
    next(default)
    assert len(prefetch_threads()) > len(before)
