"""The files beside an exported model's weights that make other tools use it as FAR did.

transformers reads generation_config.json for how to decode: without it `generate` stops only
at `<eos>`, while FAR's models end their turn with `<end_of_turn>` and FAR evaluates greedily.
The chat template (chat_template.jinja, which transformers loads with the tokenizer) renders
FAR's training prompt: a system message is the instruction line FAR puts before the question,
so `[system: INSTRUCTION, user: question]` with a generation prompt gives the very token ids
FAR trained and evaluated on. The sentencepiece tokenizer comes with the weights' source; the
byte tokenizer of the tiny test models is written here as a `tokenizers` tokenizer.json (byte
level, no merges) so AutoTokenizer encodes text to the ids FAR's ByteTokenizer gives.
"""

from __future__ import annotations

import json
import os
from typing import Any

from stages.modeling.tokenizers import SPECIAL_TOKENS, ByteTokenizer, Tokenizer

# Gemma's turn format. A leading system message joins the first user turn after one newline
# (FAR's chat_prompt: "<start_of_turn>user\n{instruction}\n{question}<end_of_turn>\n...");
# Gemma's own template joins with two, so FAR's template is its own. No `trim`: FAR's
# prompts are used exactly as written.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\n' -%}"
    "{%- set messages = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{%- if loop.first and role == 'user' -%}{{ prefix }}{%- endif -%}"
    "{{ message['content'] + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
_TURN_MARKERS = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>")
# The transformers release these files are checked against (requirements.lock). Without a
# transformers_version in config.json, transformers 5 takes a sentencepiece tokenizer for a
# pre-5.0 Mistral one and warns that its regex is wrong.
TRANSFORMERS_VERSION = "5.12.1"


def generation_config(tokenizer: Tokenizer, max_new_tokens: int) -> dict[str, Any]:
    """FAR's evaluation decoding: greedy, stopping at `<eos>` or `<end_of_turn>`."""
    return {
        "bos_token_id": tokenizer.bos_id(),
        "eos_token_id": [tokenizer.eos_id(), tokenizer.end_of_turn_id()],
        "pad_token_id": tokenizer.pad_id(),
        "do_sample": False,
        "max_new_tokens": max_new_tokens,
        "transformers_version": TRANSFORMERS_VERSION,
    }


def write_package_files(
    out_dir: str, tokenizer: Tokenizer, max_new_tokens: int, template: str = "gemma"
) -> None:
    """generation_config.json, the chat template and (byte tokenizer) the tokenizer files; and
    the transformers version in config.json. `template` is the chat markup the run's data was
    written in: gemma (FAR's template below) or tokenizer (the checkpoint's own, as shipped)."""
    config_file = os.path.join(out_dir, "config.json")
    if os.path.exists(config_file):  # an adapter's directory has none
        with open(config_file) as f:
            config = json.load(f)
        config["transformers_version"] = TRANSFORMERS_VERSION
        _write_json(out_dir, "config.json", config)
    _write_json(out_dir, "generation_config.json", generation_config(tokenizer, max_new_tokens))
    if isinstance(tokenizer, ByteTokenizer):
        _write_json(out_dir, "tokenizer.json", byte_tokenizer_json())
        _write_json(out_dir, "tokenizer_config.json", BYTE_TOKENIZER_CONFIG)
    own = getattr(tokenizer, "chat_template", None)
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(own if template == "tokenizer" and own else CHAT_TEMPLATE)


def _write_json(out_dir: str, name: str, data: dict[str, Any]) -> None:
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


BYTE_TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "pad_token": "<pad>",
    "add_bos_token": True,
    "add_eos_token": False,
    "model_max_length": 1_000_000,
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte, as `tokenizers`' ByteLevel uses."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer_json() -> dict[str, Any]:
    """FAR's ByteTokenizer as a `tokenizers` model: byte b is id 16 + b, markers are ids 0-8.

    One difference: FAR's encoder reads the text "<bos>", "<eos>" or "<pad>" as bytes, this
    one as the special token (every added token is matched in text)."""
    offset = ByteTokenizer().encode("\x00")[0]
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    bos = SPECIAL_TOKENS.index("<bos>")
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": token in _TURN_MARKERS,
            }
            for i, token in enumerate(SPECIAL_TOKENS)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<bos>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": "<bos>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [bos], "tokens": ["<bos>"]}},
        },
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {
                **{
                    SPECIAL_TOKENS[i] if i < len(SPECIAL_TOKENS) else f"<unused{i}>": i
                    for i in range(offset)
                },
                **{char: offset + b for b, char in _bytes_to_unicode().items()},
            },
            "merges": [],
        },
    }
