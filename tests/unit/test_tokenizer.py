"""The byte tokenizer: lossless, with single-token chat and format markers."""

from __future__ import annotations

import pytest

from stages.modeling.tokenizers import SPECIAL_TOKENS, ByteTokenizer


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain ascii",
        "unicode: é ✓ 😀",
        "<start_of_turn>user\nhi<end_of_turn>\n",
        "<reasoning>1 + 1 = 2</reasoning><answer>2</answer>",
        "<not_special> <answer",
    ],
)
def test_roundtrip(text: str) -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_markers_are_single_tokens() -> None:
    tok = ByteTokenizer()
    for marker in SPECIAL_TOKENS[3:]:
        assert len(tok.encode(marker)) == 1
    assert tok.encode("<start_of_turn>") == [3]


def test_ids_fit_vocab_and_unknown_ids_decode_to_nothing() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("ÿ~<answer>")
    assert max(ids) < tok.vocab_size
    assert tok.decode([tok.pad_id(), tok.eos_id(), 500, *tok.encode("ok")]) == "ok"
