"""Model families: one module per family, one interface (base.ModelFamily), one registry.

Everything FAR does differently per architecture is a method or attribute of the family
object that `get(spec.family)` returns: Tunix's network and loader, configs (preset, test
size, a checkpoint's config.json), Hugging Face weight names both ways, LoRA targets and their
Hugging Face names, the end-of-turn token, and the exported config.json. Code outside this
package asks the family and never tests a family's name (tests/unit/test_family_dispatch.py).
docs/adding-a-model-family.md says how to add one.
"""

from __future__ import annotations

from typing import Any

from stages.modeling.families import gemma2, gemma3, llama3, qwen3
from stages.modeling.families.base import DEFAULT_LORA_TARGETS, ModelFamily

__all__ = ["DEFAULT_LORA_TARGETS", "REGISTRY", "ModelFamily", "get", "of_network", "register"]

REGISTRY: dict[str, ModelFamily] = {
    family.name: family for family in (gemma3.FAMILY, gemma2.FAMILY, qwen3.FAMILY, llama3.FAMILY)
}
"""Family name -> family, in the order lookups by network try them."""


def get(name: str) -> ModelFamily:
    """The family a recipe's `model.family` names."""
    if name not in REGISTRY:
        raise KeyError(f"model family {name!r} is not registered; expected one of {list(REGISTRY)}")
    return REGISTRY[name]


def register(family: ModelFamily) -> None:
    """Add `family` to the registry (a plugin's or a test's family); a name is taken once."""
    if family.name in REGISTRY and REGISTRY[family.name] is not family:
        raise ValueError(f"model family {family.name!r} is registered already")
    REGISTRY[family.name] = family


def of_network(network: Any) -> ModelFamily | None:
    """The family of a Tunix network (or of a LoRA clone of one), None for any other object:
    the family whose network class is nearest in the network's class hierarchy (first
    registered on a tie)."""
    owners: dict[type, ModelFamily] = {}
    for family in REGISTRY.values():
        network_class = family.loaded_network_class()
        if network_class is not None:
            owners.setdefault(network_class, family)
    return next((owners[c] for c in type(network).__mro__ if c in owners), None)
