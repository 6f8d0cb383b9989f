"""Export a FAR checkpoint as a Hugging Face model directory that `transformers` loads.

Gemma 3, Gemma 2, Qwen 3 and Llama 3 checkpoints are supported (the last two's names and
config in families.py). LoRA checkpoints are merged into their base weights (Tunix's merges);
full-weight checkpoints are converted directly. The base weights come from the model's source
directory (gguf/safetensors/hub) or, for random-init test models, are written from the network
itself.
Output: model.safetensors, config.json, the tokenizer, generation_config.json, the chat
template and a model card (hf_package, export_card); or, with `adapter`, a peft adapter
(peft_export) beside the base's own export.

It is `far export`, no pipeline node, and a model-format concern: it reads a checkpoint back
into a network (models, weight_sources, tunix_compat) and writes transformers' format
(hf_config), so it sits in the modeling layer beside them rather than among the stage kinds.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tunix.models.gemma import model as gemma2_model
from tunix.models.gemma3 import params as gemma3_params

from schemas.artifacts import CheckpointArtifact
from schemas.recipe import EvalConfig, LoraSpec, MeshSpec, ModelSpec
from stages.core import storage
from stages.core.errors import InputError
from stages.core.records import find_checkpoint_record, located_output
from stages.modeling import (
    export_card,
    export_target,
    families,
    hf_package,
    models,
    peft_export,
    tunix_compat,
    weight_sources,
)
from stages.modeling import hf_config as hf
from stages.modeling.tokenizers import build_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportOptions:
    """How `far export` writes a checkpoint beyond its weights."""

    adapter: bool = False  # a peft adapter instead of merged weights
    card: str | None = None  # README.md text (export_card.model_card)
    max_new_tokens: int = EvalConfig().max_generation_tokens  # generation_config.json's
    then: Callable[[str], object] | None = None  # run on the finished local directory (a push)
    # the chat markup the run's data was written in (DatasetArtifact.prompt.template): gemma
    # writes FAR's Gemma-markup template, tokenizer the checkpoint's own
    template: str = "gemma"


def find_checkpoint(uri: str) -> CheckpointArtifact:
    """The CheckpointArtifact whose URI is `uri`, from the stage record above it, located where
    the run is now (a copied run exports its own weights)."""
    output = located_output(*find_checkpoint_record(uri))
    if not isinstance(output, CheckpointArtifact):
        raise InputError(
            f"checkpoint {uri}: its record holds a {output.kind}, not a checkpoint; "
            f"give an sft, grpo, dpo or distill output URI"
        )
    return output


# Tunix's Gemma 1/2 attention applies RoPE with its default base wavelength, not a config field
GEMMA2_ROPE_THETA = 10_000.0
_HF_LAYER_TYPES = {
    gemma2_model.AttentionType.LOCAL_SLIDING: "sliding_attention",
    gemma2_model.AttentionType.GLOBAL: "full_attention",
}


def _arr(param: Any) -> np.ndarray:
    return np.asarray(param.get_value(), dtype=np.float32)


def _attention_tensors(attn: Any, config: Any) -> dict[str, np.ndarray]:
    """q/k/v/o projections of one Tunix Gemma attention block (same layout in Gemma 2 and 3)."""
    n, h, d, k = config.num_heads, config.head_dim, config.embed_dim, config.num_kv_heads
    if hasattr(attn, "qkv_einsum"):  # num_heads == num_kv_heads: fused (3, N, D, H)
        qkv = _arr(attn.qkv_einsum.w)
        q, kv = qkv[0], qkv[1:]
    else:
        q = _arr(attn.q_einsum.w)  # (N, D, H)
        kv = _arr(attn.kv_einsum.w)  # (2, K, D, H)
    return {
        "self_attn.q_proj.weight": q.transpose(1, 0, 2).reshape(d, n * h).T,
        "self_attn.k_proj.weight": kv[0].transpose(1, 0, 2).reshape(d, k * h).T,
        "self_attn.v_proj.weight": kv[1].transpose(1, 0, 2).reshape(d, k * h).T,
        "self_attn.o_proj.weight": _arr(attn.attn_vec_einsum.w).reshape(n * h, d).T,
    }


def _mlp_tensors(mlp: Any) -> dict[str, np.ndarray]:
    return {
        "mlp.gate_proj.weight": _arr(mlp.gate_proj.kernel).T,
        "mlp.up_proj.weight": _arr(mlp.up_proj.kernel).T,
        "mlp.down_proj.weight": _arr(mlp.down_proj.kernel).T,
    }


def _gemma3_layer(layer: Any, config: Any) -> dict[str, np.ndarray]:
    q_norm, k_norm = tunix_compat.gemma3_qk_norm_scales(layer.attn)
    return {
        **_attention_tensors(layer.attn, config),
        **_mlp_tensors(layer.mlp),
        "self_attn.q_norm.weight": _arr(q_norm),
        "self_attn.k_norm.weight": _arr(k_norm),
        "input_layernorm.weight": _arr(layer.pre_attention_norm.scale),
        "post_attention_layernorm.weight": _arr(layer.post_attention_norm.scale),
        "pre_feedforward_layernorm.weight": _arr(layer.pre_ffw_norm.scale),
        "post_feedforward_layernorm.weight": _arr(layer.post_ffw_norm.scale),
    }


def _gemma2_layer(layer: Any, config: Any) -> dict[str, np.ndarray]:
    """Inverse of tunix.models.gemma.params_safetensors (Gemma 2 names its norm post_attn_norm)."""
    return {
        **_attention_tensors(layer.attn, config),
        **_mlp_tensors(layer.mlp),
        "input_layernorm.weight": _arr(layer.pre_attention_norm.scale),
        "post_attention_layernorm.weight": _arr(layer.post_attn_norm.scale),
        "pre_feedforward_layernorm.weight": _arr(layer.pre_ffw_norm.scale),
        "post_feedforward_layernorm.weight": _arr(layer.post_ffw_norm.scale),
    }


def hf_tensors(network: Any, config: Any) -> dict[str, np.ndarray]:
    """Tunix Gemma 3 or Gemma 2 parameters -> Hugging Face Gemma3ForCausalLM /
    Gemma2ForCausalLM tensors (inverse of the mapping in Tunix's params_safetensors); Qwen 3
    and Llama 3 networks by families.hf_tensors."""
    if families.family_of(network) is not None:
        return families.hf_tensors(network, config)
    layer_tensors = _gemma2_layer if _is_gemma2(config) else _gemma3_layer
    out = {
        "model.embed_tokens.weight": _arr(network.embedder.input_embedding),
        "model.norm.weight": _arr(network.final_norm.scale),
    }
    for i, layer in enumerate(network.layers):
        out |= {f"model.layers.{i}.{name}": t for name, t in layer_tensors(layer, config).items()}
    return {name: np.ascontiguousarray(t) for name, t in out.items()}


def _is_gemma2(config: Any) -> bool:
    if isinstance(config, gemma2_model.ModelConfig):
        if not (config.use_post_attn_norm and config.use_post_ffw_norm):
            raise InputError(
                "export supports Gemma 2 (post-attention and post-FFW norms); this Tunix "
                "gemma config has use_post_attn_norm="
                f"{config.use_post_attn_norm}, use_post_ffw_norm={config.use_post_ffw_norm}"
            )
        return True
    return False


def hf_config(config: Any) -> dict[str, Any]:
    """A transformers config (gemma3_text, gemma2, qwen3 or llama) for a Tunix ModelConfig."""
    if families.family_of_config(config) is not None:
        return families.hf_config(config)
    if _is_gemma2(config):
        return _gemma2_hf_config(config)
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


def _gemma2_hf_config(config: Any) -> dict[str, Any]:
    shape = hf.Gemma2Shape(
        hidden_size=config.embed_dim,
        intermediate_size=config.hidden_dim,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        sliding_window=config.sliding_window_size,
        vocab_size=config.num_embed,
        layer_types=tuple(_HF_LAYER_TYPES[t] for t in config.attention_types),
        # Tunix scales queries by head_dim ** -0.5 in every Gemma 2 size
        query_pre_attn_scalar=config.head_dim,
        attn_logit_softcapping=config.attn_logits_soft_cap,
        final_logit_softcapping=config.final_logit_softcap,
        rope_theta=GEMMA2_ROPE_THETA,
    )
    return hf.gemma2_config(shape)


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


def export_network(
    spec: ModelSpec, base: Any, policy: Any, lora: LoraSpec | None, cache_dir: str, out_dir: str
) -> None:
    """Write `policy` (a LoRA clone of `base` when `lora` is set) as an HF directory `out_dir`.

    LoRA adapters are merged by Tunix's Gemma 3 merge, which also fits Gemma 2: both name their
    projections q_einsum / kv_einsum / attn_vec_einsum / gate_proj / up_proj / down_proj and
    map them to the same Hugging Face tensor names."""
    with tempfile.TemporaryDirectory() as scratch:
        base_dir = _base_directory(spec, base, cache_dir, scratch)
        if lora is not None and families.family_of(base) is not None:
            families.merge_lora(base_dir, out_dir, policy, rank=lora.rank, alpha=lora.alpha)
        elif lora is not None:
            if hasattr(base.layers[0].attn, "qkv_einsum"):
                raise InputError(
                    "exporting LoRA on a fused-qkv model (num_heads == num_kv_heads) is not "
                    "supported by Tunix's merge; Gemma 2 and 3 presets are not fused"
                )
            gemma3_params.save_lora_merged_model_as_safetensors(
                base_dir, out_dir, policy, rank=lora.rank, alpha=lora.alpha
            )
        else:
            shutil.copytree(base_dir, out_dir, ignore=shutil.ignore_patterns("*.safetensors"))
            _write_hf_dir(policy, spec, out_dir)


def export_model(
    spec: ModelSpec,
    base: Any,
    policy: Any,
    lora: LoraSpec | None,
    cache_dir: str,
    out_dir: str,
    options: ExportOptions,
) -> None:
    """`export_network`, or (options.adapter) a peft adapter with the base's own export in
    out_dir/base unless the base is a hub repository; then the files other tools read beside
    the weights (generation config, chat template, tokenizer, model card)."""
    tokenizer = build_tokenizer(spec, cache_dir)
    if options.adapter:
        if lora is None:
            raise InputError("--adapter: the checkpoint holds full weights, not LoRA adapters")
        hub_base = export_card.base_model(spec) if spec.source == "hub" else None
        peft_export.write_adapter(policy, lora, hub_base, out_dir)
        if hub_base is None:
            base_dir = os.path.join(out_dir, "base")
            export_network(spec, base, base, None, cache_dir, base_dir)
            hf_package.write_package_files(
                base_dir, tokenizer, options.max_new_tokens, options.template
            )
        _copy_tokenizer(spec, cache_dir, out_dir)
    else:
        export_network(spec, base, policy, lora, cache_dir, out_dir)
    hf_package.write_package_files(out_dir, tokenizer, options.max_new_tokens, options.template)
    if options.card is not None:
        with open(os.path.join(out_dir, "README.md"), "w") as f:
            f.write(options.card)


def _copy_tokenizer(spec: ModelSpec, cache_dir: str, out_dir: str) -> None:
    """The sentencepiece tokenizer files of the weights' source, beside an adapter."""
    if spec.tokenizer != "sentencepiece":
        return
    source = weight_sources.resolve(spec, cache_dir)
    for name in os.listdir(source):
        if name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(source, name), out_dir)


def export_checkpoint(
    checkpoint_uri: str, out_uri: str, cache_dir: str, options: ExportOptions | None = None
) -> str:
    """Write `checkpoint_uri` as an HF model directory at `out_uri`; returns `out_uri`.

    A missing checkpoint, an `out_uri` that is a file, lies under one or is a non-empty
    directory no FAR export wrote, or an adapter export of a full-weight checkpoint is refused
    before any model is built (`far export` also verifies the checkpoint against its records
    first). The export is built in a staging folder and replaces `out_uri` whole
    (export_target); options.then (a push) runs on the finished directory before that.
    """
    options = options or ExportOptions()
    export_target.check(out_uri)  # again, for callers other than `far export`
    artifact = find_checkpoint(checkpoint_uri)
    if options.adapter and artifact.lora is None:
        raise InputError(
            f"--adapter: checkpoint {checkpoint_uri} holds full weights, not LoRA adapters; "
            "export it without --adapter"
        )
    spec = artifact.model
    mesh = models.build_mesh(MeshSpec())
    base = models.build_base_model(spec, mesh, cache_dir)
    policy = models.restore_policy(artifact, base, mesh)
    out_uri = storage.normalize(out_uri)
    with export_target.staging(out_uri) as staged:
        export_model(spec, base, policy, artifact.lora, cache_dir, staged, options)
        kind = "adapter" if options.adapter else "merged"
        facts = {"checkpoint": artifact.uri, "step": artifact.step, "kind": kind}
        export_target.write_marker(staged, facts)
        if options.then is not None:
            options.then(staged)
        export_target.publish(staged, out_uri)
    log.info("exported %s (step %d) to %s", artifact.uri, artifact.step, out_uri)
    return out_uri
