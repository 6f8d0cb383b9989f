"""What the export tests share: collecting every warning a load emits."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def load_warnings() -> Iterator[list[str]]:
    """Every Python warning and every transformers/peft/huggingface_hub log record at WARNING
    or above emitted inside the block, as lines (complete once the block has ended)."""
    caught: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(f"{record.name}: {record.getMessage()}")

    handler = Collect(logging.WARNING)
    loggers = [logging.getLogger(name) for name in ("transformers", "peft", "huggingface_hub")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            yield caught
        caught.extend(f"{w.category.__name__}: {w.message}" for w in records)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
