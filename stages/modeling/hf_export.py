"""Export a FAR checkpoint as a Hugging Face model directory that `transformers` loads.

Every registered model family is supported: its Hugging Face names, config.json and LoRA merge
are the family's (stages/modeling/families/). LoRA checkpoints are merged into their base
weights (Tunix's merges); full-weight checkpoints are converted directly. The base weights
come from the model's source directory (gguf/safetensors/hub) or, for random-init test models,
are written from the network itself.
Output: model.safetensors, config.json, the tokenizer, generation_config.json, the chat
template and a model card (hf_package, export_card); or, with `adapter`, a peft adapter
(peft_export) beside the base's own export.

It is `far export`, no pipeline node, and a model-format concern: it reads a checkpoint back
into a network (models, weight_sources, families) and writes transformers' format
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

from safetensors.numpy import save_file

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
    weight_sources,
)
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


def _write_hf_dir(network: Any, spec: ModelSpec, directory: str) -> None:
    config, family = models.tunix_config(spec), families.get(spec.family)
    save_file(family.hf_tensors(network, config), os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(family.hf_config(config), f, indent=2)


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
    """Write `policy` (a LoRA clone of `base` when `lora` is set) as an HF directory `out_dir`:
    LoRA adapters merged by the family's merge, full weights written as they are."""
    with tempfile.TemporaryDirectory() as scratch:
        base_dir = _base_directory(spec, base, cache_dir, scratch)
        if lora is not None:
            family = families.get(spec.family)
            family.merge_lora(base_dir, out_dir, policy, rank=lora.rank, alpha=lora.alpha)
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
        hf_modules = families.get(spec.family).lora_hf_modules
        peft_export.write_adapter(policy, lora, hub_base, out_dir, hf_modules)
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
