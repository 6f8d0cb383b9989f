"""The interface every model family implements: what FAR needs to know about one architecture.

A family is the only place that knows its network: Tunix's network class and safetensors
loader, the Tunix ModelConfig for a preset, a test-size architecture or a checkpoint's
config.json, the weights' Hugging Face names (the loader reads them; `hf_tensors` writes them),
the LoRA target modules and their Hugging Face names (for peft adapters), its end-of-turn
token, and the transformers config.json an export writes. Every other module asks the
family object (stages.modeling.families.get(spec.family)) and never tests a family's name.

Tunix modules are imported at first use, not when the registry is imported: the model card
and the tokenizers read the registry without JAX, and Qwen 3's module pulls in Pallas kernels
no Gemma run should pay for.
"""

from __future__ import annotations

import importlib
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from schemas.recipe import GEMMA_LORA_TARGETS, Architecture
from stages.core.errors import InputError

DEFAULT_LORA_TARGETS = GEMMA_LORA_TARGETS
"""LoraSpec.module_path's default: a family reads it as 'my attention and MLP projections'."""


class ModelFamily(ABC):
    """One model family. Subclasses set the class attributes and the abstract methods."""

    name: ClassVar[str]
    """The recipe's `model.family` (schemas.recipe.Family lists the same names)."""
    tunix_package: ClassVar[str]
    """Tunix's package of the family's network, e.g. 'tunix.models.llama3'."""
    network_class_name: ClassVar[str]
    """The network class in {tunix_package}.model, e.g. 'Llama3'."""
    params_module: ClassVar[str]
    """The module in tunix_package whose `create_model_from_safe_tensors` loads HF weights."""
    presets: ClassVar[Mapping[str, str]] = {}
    """FAR preset name (schemas.recipe.Preset) -> the Tunix ModelConfig classmethod."""
    lora_targets: ClassVar[str]
    """The LoRA module_path regex that the default DEFAULT_LORA_TARGETS means here."""
    lora_hf_modules: ClassVar[Mapping[str, str]]
    """Tunix module under a layer ('attn.q_einsum') -> Hugging Face module ('self_attn.q_proj')."""
    end_of_turn: ClassVar[str]
    """The token that ends a turn in the family's own chat format."""
    license: ClassVar[str | None] = None
    """The model card's license for real weights of the family (None: not stated)."""
    reads_config_json: ClassVar[bool] = False
    """Whether a checkpoint without preset or architecture is described by its config.json
    (schemas.recipe.CONFIG_JSON_FAMILIES lists the same names)."""
    network_fields: ClassVar[Mapping[str, str]] = {}
    """Tunix ModelConfig field -> its config.json key, for each field that changes the
    network: a preset or architecture given with a checkpoint that has a config.json must
    agree with it on each (`check_given_config`); empty: not checked."""
    reads_gguf: ClassVar[bool] = False
    """Whether `source: gguf` converts to this family (schemas.recipe.GGUF_FAMILIES)."""

    # --- Tunix's network -----------------------------------------------------------------
    def tunix_module(self, part: str = "model") -> Any:
        """{tunix_package}.{part}, imported (and the model module prepared) at first use."""
        module = importlib.import_module(f"{self.tunix_package}.{part}")
        self.prepare(importlib.import_module(f"{self.tunix_package}.model"))
        return module

    def prepare(self, model_module: Any) -> None:  # noqa: B027 (a hook: no-op by default)
        """Adapt Tunix's model module before its first use (once); nothing by default."""

    def network_modules(self) -> tuple[type, Callable[..., Any]]:
        """Tunix's network class and its params module's safetensors loader."""
        network_class = getattr(self.tunix_module(), self.network_class_name)
        return network_class, self.tunix_module(self.params_module).create_model_from_safe_tensors

    def loaded_network_class(self) -> type | None:
        """Tunix's network class if its model module is imported, else None: recognising a
        network never imports a family's module."""
        module = sys.modules.get(f"{self.tunix_package}.model")
        return None if module is None else getattr(module, self.network_class_name)

    # --- configs -------------------------------------------------------------------------
    @abstractmethod
    def tiny_config(self, arch: Architecture, dtype: Any) -> Any:
        """Tunix's ModelConfig for a random-init test network of `arch`'s shapes."""

    def preset_config(self, preset: str, dtype: Any) -> Any:
        """A published size's Tunix ModelConfig (with its own dtype unless a family sets it)."""
        if preset not in self.presets:
            raise InputError(
                f"model.preset {preset!r} is not a {self.name} preset; expected one of "
                f"{sorted(self.presets)}"
            )
        return getattr(self.tunix_module().ModelConfig, self.presets[preset])()

    def checkpoint_config(self, directory: str, dtype: Any) -> Any:
        """Tunix's ModelConfig from a checkpoint's config.json (reads_config_json families)."""
        raise InputError(
            f"model: family {self.name!r} does not read a checkpoint's config.json; "
            f"give model.preset (one of {sorted(self.presets)}) or model.architecture"
        )

    def check_checkpoint(self, directory: str) -> None:  # noqa: B027 (a hook)
        """Refuse a checkpoint directory this family would load but compute wrongly."""

    def check_given_config(self, given: Any, directory: str, named: str) -> None:
        """Refuse a preset's or architecture's config (`named` says which) that disagrees with
        the checkpoint's config.json on a `network_fields` field: the weights would load into
        another network and compute other logits, silently."""
        path = os.path.join(directory, "config.json")
        if not (self.reads_config_json and self.network_fields and os.path.exists(path)):
            return
        found = self.checkpoint_config(directory, getattr(given, "param_dtype", None))
        differ = [
            f"{field} is {_shown(getattr(given, field, None))} in {named}, "
            f"{_shown(getattr(found, field, None))} in config.json ({key})"
            for field, key in self.network_fields.items()
            if getattr(given, field, None) != getattr(found, field, None)
        ]
        if differ:
            raise InputError(
                f"model: {named} disagrees with {path}: {'; '.join(differ)}. Remove "
                f"model.preset and model.architecture (config.json then describes the network), "
                f"or use a checkpoint of that architecture"
            )

    def init_random(self, network: Any) -> Any:
        """Fix up a network Tunix's dummy creator drew (every parameter N(0, 0.02))."""
        return network

    # --- LoRA ----------------------------------------------------------------------------
    def lora_module_path(self, module_path: str) -> str:
        """The recipe's LoRA regex for this family: the default means `lora_targets`."""
        return self.lora_targets if module_path == DEFAULT_LORA_TARGETS else module_path

    @abstractmethod
    def merge_lora(self, base_dir: str, out_dir: str, policy: Any, rank: int, alpha: float) -> None:
        """Write `base_dir`'s HF weights plus `policy`'s LoRA adapters, merged, to `out_dir`."""

    # --- Hugging Face export -------------------------------------------------------------
    @abstractmethod
    def hf_tensors(self, network: Any, config: Any) -> dict[str, np.ndarray]:
        """The network's parameters under their Hugging Face names (the loader's inverse)."""

    @abstractmethod
    def hf_config(self, config: Any) -> dict[str, Any]:
        """transformers' config.json for a Tunix ModelConfig of this family."""


def _shown(value: Any) -> str:
    """A config value in an error message (an enum by its name)."""
    return str(getattr(value, "name", value))


def arr(param: Any) -> np.ndarray:
    """A parameter's value as f32 numpy (what the exports write)."""
    return np.asarray(param.get_value(), dtype=np.float32)
