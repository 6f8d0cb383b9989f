"""The prepared dataset's files: their names, their layout, and how consumers load them.

data_prep writes a dataset directory; SFT, GRPO and evaluation read it. The format belongs to
neither side, so it lives here, and a consumer never imports the stage that produced the data.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

from schemas.artifacts import DatasetArtifact
from stages.core import storage
from stages.core.errors import InputError, MissingInput
from stages.core.runner import RECORD_NAME

# The arrays of sft_train.npz, each [rows, seq_len] int32 (segment_ids 0 = padding).
SFT_FIELDS = ("input_tokens", "input_mask", "segment_ids", "positions")
SPLIT_FILES = {
    "sft_train": "sft_train.npz",
    "grpo_train": "grpo_prompts.jsonl",
    "eval": "eval_prompts.jsonl",
}


def sft_npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stub types kwds as bool
    return buffer.getvalue()


def load_sft_arrays(artifact: DatasetArtifact) -> dict[str, np.ndarray]:
    data = storage.read_bytes(storage.join(artifact.uri, SPLIT_FILES["sft_train"]))
    with np.load(io.BytesIO(data)) as npz:
        return {k: npz[k] for k in SFT_FIELDS}


def load_prompts(artifact: DatasetArtifact, split: str) -> list[dict[str, Any]]:
    """Rows of a prompt split: id, source, domain, prompt (chat-formatted), answer, tests."""
    text = storage.read_text(storage.join(artifact.uri, SPLIT_FILES[split]))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def check_dataset(dataset: DatasetArtifact, tokenizer_name: str) -> None:
    """Refuse data that is missing, uncommitted or tokenized for another model, before compute."""
    record_uri = storage.join(dataset.uri, RECORD_NAME)
    if not storage.exists(record_uri):
        raise MissingInput(
            f"dataset {dataset.uri} is not a committed data_prep output (no {record_uri})"
        )
    if dataset.tokenizer != tokenizer_name:
        raise InputError(
            f"dataset {dataset.uri} was tokenized with {dataset.tokenizer!r}, "
            f"the model uses {tokenizer_name!r}"
        )
