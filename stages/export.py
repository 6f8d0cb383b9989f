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
from stages.core import storage
from stages.core.runner import find_checkpoint_record
from stages.modeling import hf_config as hf
from stages.modeling import models, tunix_compat, weight_sources

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

    out = {
        "model.embed_tokens.weight": arr(network.embedder.input_embedding),
        "model.norm.weight": arr(network.final_norm.scale),
    }
    for i, layer in enumerate(network.layers):
        p, attn = f"model.layers.{i}.", layer.attn
        q_norm, k_norm = tunix_compat.gemma3_qk_norm_scales(attn)
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
            p + "self_attn.q_norm.weight": arr(q_norm),
            p + "self_attn.k_norm.weight": arr(k_norm),
            p + "mlp.gate_proj.weight": arr(layer.mlp.gate_proj.kernel).T,
            p + "mlp.up_proj.weight": arr(layer.mlp.up_proj.kernel).T,
            p + "mlp.down_proj.weight": arr(layer.mlp.down_proj.kernel).T,
            p + "input_layernorm.weight": arr(layer.pre_attention_norm.scale),
            p + "post_attention_layernorm.weight": arr(layer.post_attention_norm.scale),
            p + "pre_feedforward_layernorm.weight": arr(layer.pre_ffw_norm.scale),
            p + "post_feedforward_layernorm.weight": arr(layer.post_ffw_norm.scale),
        }
    return {name: np.ascontiguousarray(t) for name, t in out.items()}


def hf_config(config: Any) -> dict[str, Any]:
    """A transformers gemma3_text config for a Tunix Gemma3 ModelConfig."""
    shape = hf.Gemma3TextShape(
        hidden_size=config.embed_dim,
        intermediate_size=config.hidden_dim,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        sliding_window=config.sliding_window_size,
        vocab_size=config.num_embed,
        full_rope=hf.rope(config.global_base_frequency, config.global_scale_factor),
        sliding_rope=hf.rope(config.local_base_frequency, config.local_scale_factor),
    )
    return hf.gemma3_text_config(shape)


def _write_hf_dir(network: Any, spec: ModelSpec, directory: str) -> None:
    config = models.tunix_config(spec)
    save_file(hf_tensors(network, config), os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config(config), f, indent=2)


def _base_directory(spec: ModelSpec, base: Any, cache_dir: str, scratch: str) -> str:
    """An HF directory with the base weights: the model's source, or written from `base`."""
    if spec.source != "random":
        return weight_sources.resolve(spec, cache_dir)
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
