"""Export a FAR checkpoint as a Hugging Face model directory that `transformers` loads.

LoRA checkpoints are merged into their base weights (Tunix's Gemma3 merge); full-weight
checkpoints are converted directly. The base weights come from the model's source directory
(gguf/safetensors/hub) or, for random-init test models, are written from the network itself.
Output: model.safetensors, config.json and, for sentencepiece models, the tokenizer files.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tunix.models.gemma3 import params as gemma3_params

from schemas.artifacts import CheckpointArtifact
from schemas.recipe import MeshSpec, ModelSpec
from stages import model_sources, models, storage
from stages.runner import find_checkpoint_record

log = logging.getLogger(__name__)


def find_checkpoint(uri: str) -> CheckpointArtifact:
    """The CheckpointArtifact whose URI is `uri`, from the stage record above it."""
    _, record = find_checkpoint_record(uri)
    if not isinstance(record.output, CheckpointArtifact):
        raise TypeError(f"record for {uri} holds a {record.output.kind}, not a checkpoint")
    return record.output


def hf_tensors(network: Any, config: Any) -> dict[str, np.ndarray]:
    """Tunix Gemma3 parameters -> Hugging Face Gemma3ForCausalLM tensors (inverse of the
    mapping in tunix.models.gemma3.params_safetensors)."""
    n, h, d, k = config.num_heads, config.head_dim, config.embed_dim, config.num_kv_heads

    def arr(param: Any) -> np.ndarray:
        return np.asarray(param.get_value(), dtype=np.float32)

    out = {"model.embed_tokens.weight": arr(network.embedder.input_embedding),
           "model.norm.weight": arr(network.final_norm.scale)}  # fmt: skip
    for i, layer in enumerate(network.layers):
        p, attn = f"model.layers.{i}.", layer.attn
        if hasattr(attn, "qkv_einsum"):  # num_heads == num_kv_heads: fused (3, N, D, H)
            qkv = arr(attn.qkv_einsum.w)
            q, kv = qkv[0], qkv[1:]
        else:
            q = arr(attn.q_einsum.w)  # (N, D, H)
            kv = arr(attn.kv_einsum.w)  # (2, K, D, H)
        out |= {
            p + "self_attn.q_proj.weight": q.transpose(1, 0, 2).reshape(d, n * h).T,
            p + "self_attn.k_proj.weight": kv[0].transpose(1, 0, 2).reshape(d, k * h).T,
            p + "self_attn.v_proj.weight": kv[1].transpose(1, 0, 2).reshape(d, k * h).T,
            p + "self_attn.o_proj.weight": arr(attn.attn_vec_einsum.w).reshape(n * h, d).T,
            p + "self_attn.q_norm.weight": arr(attn._query_norm.scale),
            p + "self_attn.k_norm.weight": arr(attn._key_norm.scale),
            p + "mlp.gate_proj.weight": arr(layer.mlp.gate_proj.kernel).T,
            p + "mlp.up_proj.weight": arr(layer.mlp.up_proj.kernel).T,
            p + "mlp.down_proj.weight": arr(layer.mlp.down_proj.kernel).T,
            p + "input_layernorm.weight": arr(layer.pre_attention_norm.scale),
            p + "post_attention_layernorm.weight": arr(layer.post_attention_norm.scale),
            p + "pre_feedforward_layernorm.weight": arr(layer.pre_ffw_norm.scale),
            p + "post_feedforward_layernorm.weight": arr(layer.post_ffw_norm.scale),
        }  # fmt: skip
    return {name: np.ascontiguousarray(t) for name, t in out.items()}


def hf_config(config: Any) -> dict[str, Any]:
    """A transformers gemma3_text config for a Tunix Gemma3 ModelConfig."""
    layers = config.num_layers
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_size": config.embed_dim, "intermediate_size": config.hidden_dim,
        "num_hidden_layers": layers, "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads, "head_dim": config.head_dim,
        "query_pre_attn_scalar": config.head_dim, "sliding_window": config.sliding_window_size,
        "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                        for i in range(layers)],
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "full_attention": _rope(config.global_base_frequency, config.global_scale_factor),
            "sliding_attention": _rope(config.local_base_frequency, config.local_scale_factor),
        },
        "hidden_activation": "gelu_pytorch_tanh", "vocab_size": config.num_embed,
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "tie_word_embeddings": True,
        "final_logit_softcapping": None, "attn_logit_softcapping": None,
        "torch_dtype": "float32",
    }  # fmt: skip


def _rope(theta: float, factor: float) -> dict[str, Any]:
    if factor == 1.0:
        return {"rope_type": "default", "rope_theta": float(theta)}
    return {"rope_type": "linear", "rope_theta": float(theta), "factor": float(factor)}


def _write_hf_dir(network: Any, spec: ModelSpec, directory: str) -> None:
    config = models.tunix_config(spec)
    save_file(hf_tensors(network, config), os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config(config), f, indent=2)


def _base_directory(spec: ModelSpec, base: Any, cache_dir: str, scratch: str) -> str:
    """An HF directory with the base weights: the model's source, or written from `base`."""
    if spec.source != "random":
        return model_sources.resolve(spec, cache_dir)
    directory = os.path.join(scratch, "base")
    os.makedirs(directory)
    _write_hf_dir(base, spec, directory)
    return directory


def export_checkpoint(checkpoint_uri: str, out_uri: str, cache_dir: str) -> str:
    """Write `checkpoint_uri` as an HF model directory at `out_uri`; returns `out_uri`."""
    artifact = find_checkpoint(checkpoint_uri)
    spec = artifact.model
    if spec.family != "gemma3":
        raise ValueError(f"export supports gemma3 checkpoints, got family {spec.family!r}")
    mesh = models.build_mesh(MeshSpec())
    base = models.build_base_model(spec, mesh, cache_dir)
    with tempfile.TemporaryDirectory() as scratch:
        base_dir = _base_directory(spec, base, cache_dir, scratch)
        policy = models.restore_policy(artifact, base, mesh)
        merged = os.path.join(scratch, "merged")
        if artifact.lora is not None:
            if hasattr(base.layers[0].attn, "qkv_einsum"):  # type: ignore[attr-defined]
                raise ValueError(
                    "exporting LoRA on a fused-qkv model (num_heads == num_kv_heads) is not "
                    "supported by Tunix's merge; Gemma 3 presets are not fused"
                )
            gemma3_params.save_lora_merged_model_as_safetensors(
                base_dir, merged, policy, rank=artifact.lora.rank, alpha=artifact.lora.alpha
            )
        else:
            shutil.copytree(base_dir, merged, ignore=shutil.ignore_patterns("*.safetensors"))
            _write_hf_dir(policy, spec, merged)
        out_uri = storage.normalize(out_uri)
        storage.upload_tree(merged, out_uri)
    log.info("exported %s (step %d) to %s", artifact.uri, artifact.step, out_uri)
    return out_uri
