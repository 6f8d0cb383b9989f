"""Real-layout Qwen 3, Llama 3.2 and Gemma 3 checkpoints (saved by transformers, tokenizer.json
and the family's chat template, Llama's rope_scaling llama3, Gemma 3's two RoPE bases) load in
FAR as transformers loads them: the same config, token ids, rendered chat and logits."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from schemas.recipe import MeshSpec, ModelSpec
from stages.data_prep.build import chat_prompt, format_target
from stages.modeling import families, models, rope_adaptation, tokenizers
from tests.hf_checkpoints import write_checkpoint

torch = pytest.importorskip("torch")
ATOL = 1e-4
TEXT = "What is 3 + 4? <reasoning>3 plus 4 is 7.</reasoning><answer>7</answer> and more words"


@pytest.fixture(scope="module", params=["qwen3", "llama3", "gemma3"])
def checkpoint(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    family = request.param
    return family, write_checkpoint(family, tmp_path_factory.mktemp(family))


def _spec(family: str, directory: Path) -> ModelSpec:
    return ModelSpec(
        family=family, source="safetensors", uri=str(directory), tokenizer="sentencepiece"
    )


def _far_logits(network: Any, ids: list[int]) -> np.ndarray:
    tokens = np.asarray([ids], dtype=np.int32)
    positions = np.arange(len(ids), dtype=np.int32)[None]
    mask = np.tril(np.ones((1, len(ids), len(ids)), dtype=bool))
    logits, _ = network(tokens, positions, None, mask)
    return np.asarray(logits[0], dtype=np.float32)


def _hf_logits(directory: Path, ids: list[int]) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def test_far_logits_equal_transformers(checkpoint: tuple[str, Path], tmp_path: Path) -> None:
    family, directory = checkpoint
    spec = _spec(family, directory)
    tokenizer = tokenizers.build_tokenizer(spec, str(tmp_path))
    ids = [tokenizer.bos_id(), *tokenizer.encode(TEXT)]
    network = models.build_base_model(spec, models.build_mesh(MeshSpec()), str(tmp_path))
    expected = _hf_logits(directory, ids)
    assert np.abs(expected).max() > 0.5  # far from zero: a wrong rotation would show
    np.testing.assert_allclose(_far_logits(network, ids), expected, atol=ATOL)


def test_llama3_logits_need_the_checkpoint_rope(tmp_path: Path) -> None:
    """The same Llama 3.2 weights under Tunix's own RoPE (base 1e6, no scaling) compute other
    logits: what the adaptation fixes, and why the test above can fail."""
    directory = write_checkpoint("llama3", tmp_path / "llama")
    spec = _spec("llama3", directory)
    config = models.tunix_config(spec, str(tmp_path))
    assert rope_adaptation.rope_scaling(config) is not None
    assert config.rope_theta == 500_000
    plain_class = families.get("llama3").tunix_module().ModelConfig
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(plain_class)}
    plain = plain_class(**fields | {"rope_theta": 1_000_000})
    _, loader = models.network_modules("llama3")
    mesh = models.build_mesh(MeshSpec())
    with mesh:
        network = loader(str(directory), plain, mesh=mesh)
    ids = list(range(3, 40))
    gap = np.abs(_far_logits(network, ids) - _hf_logits(directory, ids)).max()
    assert gap > 1e-2


def test_gemma3_reads_both_rope_bases_from_config_json(tmp_path: Path) -> None:
    """Gemma 3's config is its config.json's: the full-attention base 1e6 and the sliding
    base 1e4 (Tunix's defaults are 1e4 for both, which an `architecture` block would get)."""
    directory = write_checkpoint("gemma3", tmp_path / "gemma")
    config = models.tunix_config(_spec("gemma3", directory), str(tmp_path))
    assert (config.global_base_frequency, config.local_base_frequency) == (1_000_000, 10_000)
    assert (config.num_layers, config.sliding_window_size, config.head_dim) == (6, 8, 16)


def test_tokenizer_json_ids_and_chat_template_equal_transformers(
    checkpoint: tuple[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    family, directory = checkpoint
    tokenizer = tokenizers.build_tokenizer(_spec(family, directory), str(tmp_path))
    theirs = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.encode(TEXT) == theirs.encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(tokenizer.encode(TEXT)) == TEXT
    assert tokenizer.eos_id() == theirs.eos_token_id
    assert tokenizer.end_of_turn_id() == theirs.convert_tokens_to_ids(
        {"qwen3": "<|im_end|>", "llama3": "<|eot_id|>", "gemma3": "<end_of_turn>"}[family]
    )
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    ours = tokenizers.apply_chat_template(tokenizer, messages, add_generation_prompt=True)
    # transformers fills bos_token and today's date; FAR renders BOS as an id and no date
    rendered = theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, date_string="26 Jul 2024"
    )
    assert (theirs.bos_token or "") + ours == rendered


def test_template_tokenizer_prompt_and_target_use_the_family_markup(
    checkpoint: tuple[str, Path], tmp_path: Path
) -> None:
    from schemas.recipe.data import PromptFormat

    family, directory = checkpoint
    tokenizer = tokenizers.build_tokenizer(_spec(family, directory), str(tmp_path))
    prompt = PromptFormat(template="tokenizer")
    opened = chat_prompt("What is 3 + 4?", prompt, tokenizer)
    target = format_target("3 plus 4 is 7.", "7", prompt, tokenizer, "What is 3 + 4?")
    marker, close = {
        "qwen3": ("<|im_start|>assistant\n", "<|im_end|>"),
        "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
        "gemma3": ("<start_of_turn>model\n", "<end_of_turn>"),
    }[family]
    assert opened.endswith(marker)
    assert close in target and "<answer>7</answer>" in target


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_the_checkpoint_from_gcs_and_from_the_hub_cache_loads_as_the_local_one(
    family: str, fake_gcs: str, tmp_path: Path
) -> None:
    """`source: safetensors` on a gs:// URI (a local GCS API) and `source: hub` (files laid
    out as huggingface_hub's cache keeps them, offline) read the same config.json, weights,
    tokenizer.json and chat template as the local directory: equal ids, chat and logits."""
    from stages.core import storage

    directory = write_checkpoint(family, tmp_path / "local")
    remote = f"gs://{fake_gcs}/checkpoints/{family}"
    for path in sorted(directory.iterdir()):
        storage.write_bytes(storage.join(remote, path.name), path.read_bytes())
    revision = "1" * 40
    repo = tmp_path / "hub-cache" / "hub" / f"models--far-test--tiny-{family}"
    (repo / "snapshots").mkdir(parents=True)
    (repo / "snapshots" / revision).symlink_to(directory)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    local = _spec(family, directory)
    specs = {
        "gcs": (local.model_copy(update={"uri": remote}), str(tmp_path / "gcs-cache")),
        "hub": (
            local.model_copy(update={"source": "hub", "uri": f"far-test/tiny-{family}"}),
            str(tmp_path / "hub-cache"),
        ),
    }
    messages = [{"role": "user", "content": "2+2?"}]
    mesh = models.build_mesh(MeshSpec())
    seen = {}
    for name, (spec, cache) in {"local": (local, str(tmp_path / "c")), **specs}.items():
        tokenizer = tokenizers.build_tokenizer(spec, cache)
        ids = [tokenizer.bos_id(), *tokenizer.encode(TEXT)]
        chat = tokenizers.apply_chat_template(tokenizer, messages, add_generation_prompt=True)
        network = models.build_base_model(spec, mesh, cache)
        seen[name] = (ids, chat, _far_logits(network, ids))
    ids, chat, logits = seen["local"]
    assert "<|im_start|>" in chat or "<|start_header_id|>" in chat  # the family's own template
    for name in specs:
        assert seen[name][:2] == (ids, chat), name
        np.testing.assert_array_equal(seen[name][2], logits)
