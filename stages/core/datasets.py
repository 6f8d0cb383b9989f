"""The prepared dataset's files: their names, their layout, and how consumers load them.

data_prep writes a dataset directory; SFT, GRPO and evaluation read it. The format belongs to
neither side, so it lives here, and a consumer never imports the stage that produced the data.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from schemas.artifacts import DataCard, DatasetArtifact
from stages.core import storage
from stages.core.errors import InputError, MissingInput
from stages.core.records import RECORD_NAME, find_record

if TYPE_CHECKING:
    import grain

# The arrays of sft_train.npz, each [rows, seq_len] int32 (segment_ids 0 = padding).
SFT_FIELDS = ("input_tokens", "input_mask", "segment_ids", "positions")
SPLIT_FILES = {
    "sft_train": "sft_train.npz",
    "grpo_train": "grpo_prompts.jsonl",
    "eval": "eval_prompts.jsonl",
    "validation": "validation_prompts.jsonl",
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
    if split not in artifact.split_sizes:
        raise InputError(
            f"dataset {artifact.uri} has no {split!r} split (it has {sorted(artifact.split_sizes)})"
            f"; {'set data.validation in the recipe' if split == 'validation' else 'expected it'}"
        )
    text = storage.read_text(storage.join(artifact.uri, SPLIT_FILES[split]))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def evaluated_split(evaluation_uri: str) -> str:
    """The dataset split an evaluation scored, from its committed stage record ('eval' when
    its config does not name one: the default, left out of the hash)."""
    found = find_record(evaluation_uri, levels=2)
    if found is None:
        raise MissingInput(f"evaluation {evaluation_uri} is not committed (no stage record)")
    config = found[1].config.get("eval", {})
    return str(config.get("split", "eval"))


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


def pad_rows(
    sequences: list[tuple[list[int], list[int]]], seq_len: int, pad_id: int
) -> dict[str, np.ndarray]:
    """Unpacked SFT arrays (one example per row, right-padded) in the sft_train.npz layout."""
    rows = len(sequences)
    tokens = np.full((rows, seq_len), pad_id, dtype=np.int32)
    mask, segments, positions = (np.zeros((rows, seq_len), dtype=np.int32) for _ in range(3))
    for i, (ids, loss) in enumerate(sequences):
        if len(ids) > seq_len:
            raise ValueError(f"SFT row {i} has {len(ids)} tokens, more than seq_len {seq_len}")
        n = len(ids)
        tokens[i, :n], mask[i, :n], segments[i, :n] = ids, loss, 1
        positions[i, :n] = np.arange(n)
    return {
        "input_tokens": tokens,
        "input_mask": mask,
        "segment_ids": segments,
        "positions": positions,
    }


def write_derived_dataset(
    directory: str,
    base: DatasetArtifact,
    prompts: dict[str, list[dict[str, Any]]],
    sft_arrays: dict[str, np.ndarray] | None = None,
    extra_files: dict[str, bytes] | None = None,
) -> DatasetArtifact:
    """A dataset made from another (a subset of its prompts, new SFT rows): same files, same
    tokenizer and shapes as `base`. `prompts` maps split ('grpo_train', 'eval') to rows."""
    files = {SPLIT_FILES[split]: jsonl_bytes(rows) for split, rows in prompts.items()}
    if sft_arrays is not None:
        files[SPLIT_FILES["sft_train"]] = sft_npz_bytes(sft_arrays)
    files.update(extra_files or {})
    digest = hashlib.sha256()
    for name in sorted(files):
        storage.write_bytes(storage.join(directory, name), files[name])
        digest.update(name.encode() + hashlib.sha256(files[name]).digest())
    sizes = {split: len(rows) for split, rows in prompts.items()}
    sft_rows = 0 if sft_arrays is None else int(sft_arrays["input_tokens"].shape[0])
    if sft_arrays is not None:
        sizes["sft_train"] = sft_rows
    domains = {s: Counter(r.get("domain", "math") for r in rows) for s, rows in prompts.items()}
    card = DataCard(
        counts_by_source={
            s: dict(Counter(r.get("source", "?") for r in rows)) for s, rows in prompts.items()
        },
        counts_by_domain={s: dict(c) for s, c in domains.items()},
        target_mix={},
        achieved_mix={
            s: {d: n / max(1, sum(c.values())) for d, n in c.items()} for s, c in domains.items()
        },
        quarantined_by_reason={},
        sft_length_histogram={},
        packed=False,
        sft_rows=sft_rows,
        useful_token_fraction=0.0
        if sft_arrays is None
        else float((sft_arrays["segment_ids"] > 0).mean()),
    )
    return DatasetArtifact(
        uri=directory,
        tokenizer=base.tokenizer,
        seq_len=base.seq_len,
        prompt_len=base.prompt_len,
        split_sizes=sizes,
        quarantined=0,
        card=card,
        fingerprint=digest.hexdigest(),
        prompt=base.prompt,
    )


def jsonl_bytes(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()


def in_memory_stream(dataset: grain.MapDataset) -> Iterator[Any]:
    """Iterate `dataset` (built over arrays already in memory) on the caller's thread.

    `iter(MapDataset)` would read ahead up to 500 elements on 16 threads. Over an endlessly
    repeating batch stream those threads start with the first step and compete with its
    compilation, slowing the first step (docs/performance.md; `python -m bench.vs_tunix`);
    the elements and their order are the same either way. Grain reads in-memory data best
    without threads (its ReadOptions docstring says so). grain is imported here, not with the
    module: it imports JAX, which readers of the file layout (far validate) must not pay for.
    """
    import grain

    read = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    return iter(dataset.to_iter_dataset(read))
