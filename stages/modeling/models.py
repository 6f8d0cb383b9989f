"""Build Tunix models from a ModelSpec: mesh, base network, LoRA adapters, checkpoint restore.

Everything model-shaped that more than one stage needs lives here, so SFT, GRPO and
evaluation construct and restore networks the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import qwix
from flax import nnx
from jax.sharding import Mesh
from tunix.models import dummy_model_creator
from tunix.sft import checkpoint_manager as tunix_ckpt
from tunix.utils import mesh as tunix_mesh

from schemas.artifacts import CheckpointArtifact
from schemas.recipe import LoraSpec, MeshSpec, ModelSpec
from stages.core import drift, storage
from stages.core.errors import InputError, MissingInput
from stages.core.shared import SharedBuilds
from stages.modeling import families, weight_sources

log = logging.getLogger(__name__)
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
CONFIG_JSON_SOURCES = ("safetensors", "hub")
"""Sources whose checkpoint's config.json a preset or architecture must agree with (a GGUF
file's config.json is written by FAR from the file)."""


def build_mesh(spec: MeshSpec) -> Mesh:
    """An (fsdp, tp) mesh with Auto axis types (Explicit breaks Gemma3's embedder)."""
    needed = spec.fsdp * spec.tp
    if needed > jax.device_count():
        raise InputError(
            f"mesh fsdp={spec.fsdp} x tp={spec.tp} needs {needed} devices, "
            f"found {jax.device_count()} ({jax.devices()[0].platform})"
        )
    devices = jax.devices()[:needed]
    return tunix_mesh.create_mesh((spec.fsdp, spec.tp), ("fsdp", "tp"), devices=devices)


def network_modules(family: str) -> tuple[type[nnx.Module], Callable[..., nnx.Module]]:
    """The family's Tunix network class and its safetensors loader."""
    return families.get(family).network_modules()


def tunix_config(spec: ModelSpec, cache_dir: str | None = None) -> Any:
    """Tunix's ModelConfig for `spec`, from its family (stages/modeling/families/).

    A checkpoint without preset or architecture (families that read config.json) is described
    by its own config.json (`cache_dir` resolves a remote one; once resolved in this process
    it is not needed again)."""
    family, dtype = families.get(spec.family), _DTYPES[spec.dtype]
    if spec.preset is None and spec.architecture is None:
        return family.checkpoint_config(weight_sources.resolve(spec, cache_dir), dtype)
    if spec.preset is not None:
        return family.preset_config(spec.preset, dtype)
    if spec.architecture is None:  # ModelSpec's validator guarantees one of preset / architecture
        raise ValueError("model spec has neither preset nor architecture")
    return family.tiny_config(spec.architecture, dtype)


def build_base_model(spec: ModelSpec, mesh: Mesh, cache_dir: str) -> nnx.Module:
    """The base network on `mesh`: random init, or real weights via an HF-layout directory."""
    config = tunix_config(spec, cache_dir)
    dtype = _DTYPES[spec.dtype]
    family = families.get(spec.family)
    model_class, from_safetensors = family.network_modules()
    if spec.source == "random":
        network = dummy_model_creator.create_dummy_model(
            model_class, config, mesh=mesh, dtype=dtype, random_seed=spec.init_seed
        )
        return family.init_random(network)
    directory = weight_sources.resolve(spec, cache_dir)
    family.check_checkpoint(directory)
    if spec.source in CONFIG_JSON_SOURCES and (spec.preset or spec.architecture):
        named = f"model.preset {spec.preset!r}" if spec.preset else "model.architecture"
        family.check_given_config(config, directory, named)
    with mesh:
        return from_safetensors(directory, config, mesh=mesh, dtype=dtype)


def base_model(
    spec: ModelSpec, mesh: Mesh, cache_dir: str, shared: SharedBuilds | None, private: bool
) -> nnx.Module:
    """The base network for a stage: the run's shared one, or one built for the caller alone.

    `private`: the caller changes the weights (full-weight training or restore), so it gets
    its own network. Otherwise the network comes from `shared` (built at its first use in the
    run) and must not be changed: LoRA clones (`apply_lora`) leave it untouched.
    """
    if private or shared is None:
        return build_base_model(spec, mesh, cache_dir)
    key = (spec.model_dump_json(), mesh, cache_dir)
    return shared.get("base_model", key, lambda: build_base_model(spec, mesh, cache_dir))


def policy_network(
    artifact: CheckpointArtifact,
    mesh: Mesh,
    cache_dir: str,
    shared: SharedBuilds | None,
    base: nnx.Module | None = None,
) -> nnx.Module:
    """The checkpoint's policy: a LoRA clone of a base network, or a private full network.

    A LoRA policy goes on `base` (the caller's base network for artifact.model, left
    unchanged), else on the run's shared base network.
    """
    if artifact.lora is None:
        return restore_policy(artifact, build_base_model(artifact.model, mesh, cache_dir), mesh)
    if base is None:
        base = base_model(artifact.model, mesh, cache_dir, shared, private=False)
    return restore_policy(artifact, base, mesh)


def apply_lora(base: nnx.Module, lora: LoraSpec, mesh: Mesh, seed: int = 0) -> nnx.Module:
    """A LoRA clone of `base` that shares its frozen weights (base stays usable as reference).

    `seed` initializes the adapters; a restored checkpoint overwrites them anyway. The
    adapters' backward goes through tunix_compat's written-out one where the stage installs
    the fast path "lora_backward" (stages/modeling/fast_paths.py: the same gradients, bit for
    bit, without XLA CPU's transposed copies).
    """
    family = families.of_network(base)
    module_path = lora.module_path if family is None else family.lora_module_path(lora.module_path)
    provider = qwix.LoraProvider(module_path=module_path, rank=lora.rank, alpha=lora.alpha)
    model_input = base.get_model_input()  # type: ignore[attr-defined]
    with mesh:
        lora_model = qwix.apply_lora_to_model(
            base, provider, rngs=nnx.Rngs(params=seed), **model_input
        )
        # Place only the new adapters: resharding the whole state would copy the base
        # weights and break the sharing that lets `base` serve as GRPO's reference.
        adapters = nnx.state(lora_model, nnx.LoRAParam)
        if not jax.tree.leaves(adapters):
            raise InputError(
                f"lora.module_path {module_path!r} matched no module of this "
                f"{type(base).__name__} network; give a regex over its projections' paths"
            )
        sharded = jax.lax.with_sharding_constraint(adapters, nnx.get_partition_spec(adapters))
        nnx.update(lora_model, sharded)
    return lora_model


def copy_lora_policy(policy: nnx.Module, mesh: Mesh) -> nnx.Module:
    """A second LoRA policy equal to `policy`: its adapters are copies, its frozen base
    weights the same arrays. Cheaper than restoring the checkpoint again (which applies LoRA
    to the network anew); the copies let one policy train (its trainer may donate its
    adapters' buffers) while the other stays as it was.
    """
    graphdef, adapters, frozen = nnx.split(policy, nnx.LoRAParam, ...)  # type: ignore[misc]
    with mesh:
        copied = jax.tree.map(jnp.copy, adapters)
    return nnx.merge(graphdef, copied, frozen)


def param_bytes(network: nnx.Module) -> int:
    """Bytes of all parameters: what a full-weights checkpoint stores for the model."""
    leaves = jax.tree.leaves(nnx.state(network, nnx.Param))
    return int(sum(leaf.size * leaf.dtype.itemsize for leaf in leaves))


def check_compatible(artifact: CheckpointArtifact, spec: ModelSpec, tokenizer: str) -> None:
    """Refuse a checkpoint built for another model or tokenizer, before any compute."""
    if artifact.model != spec:
        changes = drift.diff(artifact.model.model_dump(mode="json"), spec.model_dump(mode="json"))
        raise InputError(
            f"checkpoint {artifact.uri} was built for another model config; "
            f"differences (checkpoint -> recipe): {'; '.join(map(str, changes))}"
        )
    if artifact.tokenizer != tokenizer:
        raise InputError(
            f"checkpoint {artifact.uri} uses tokenizer {artifact.tokenizer!r}, "
            f"the recipe's model uses {tokenizer!r}"
        )
    step_dir = storage.join(artifact.uri, str(artifact.step))
    if not storage.exists(step_dir):
        raise MissingInput(
            f"checkpoint {artifact.uri} has no committed step {artifact.step} (looked for "
            f"{step_dir})"
        )


def restore_policy(artifact: CheckpointArtifact, base: nnx.Module, mesh: Mesh) -> nnx.Module:
    """Load a CheckpointArtifact onto `base` (built from artifact.model).

    LoRA checkpoints give a LoRA clone sharing base's weights, so `base` stays a usable,
    unchanged reference model; full-weight checkpoints are restored into `base` itself.
    """
    model = apply_lora(base, artifact.lora, mesh) if artifact.lora else base
    directory = storage.fetch_tree(artifact.uri)
    manager = tunix_ckpt.CheckpointManager(directory)
    try:
        with mesh:
            step, _ = manager.maybe_restore(
                model, step=artifact.step, restore_only_lora_params=artifact.lora is not None
            )
    finally:
        manager.close()
    if step != artifact.step:
        raise RuntimeError(f"restored step {step} from {artifact.uri}, expected {artifact.step}")
    log.info("restored %s step %d", artifact.uri, step)
    return model
