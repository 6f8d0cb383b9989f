"""A stage's identity: everything that determines its output, whose digest names its directory.

The hash covers the stage's config, the fingerprints of its inputs and a hand-bumped
STAGE_VERSION. Only STAGE_VERSION stands for "code": commits that do not alter a stage's
outputs (refactors, logging, docs) leave finished stages valid. The drift guard's view of two
identities (what changed between a node's directories) lives here too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas.recipe import ModelSpec
from stages.core import drift

StageName = str  # a registered stage kind (stages/registry.py)

SOURCE_PREFIX = "source:"  # identity inputs that are external data, not upstream artifacts

REWARD_SOURCE = "reward:"  # "source:reward:NAME:MODULE": a user's reward's source file digest


@dataclass(frozen=True)
class StageIdentity:
    """Everything that determines a stage's output; its digest names the stage directory."""

    stage: StageName
    version: int
    config: dict[str, Any]
    inputs: dict[str, str]  # upstream name -> fingerprint ("source:<label>" for data sources)
    input_uris: dict[str, str] | None = None  # upstream name -> artifact URI (not hashed)

    @property
    def digest(self) -> str:
        """sha256 of the stage, version, config and inputs (not the URIs): names the directory."""
        payload = {
            "stage": self.stage,
            "version": self.version,
            "config": self.config,
            "inputs": self.inputs,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def with_uris(identity: StageIdentity, **uris: str) -> StageIdentity:
    """The identity with its inputs' URIs attached (for lineage; URIs are not hashed).

    Args:
        identity: the stage's identity.
        **uris: each input's artifact URI, by the input name the identity hashes.

    Returns:
        A copy of `identity` with `input_uris` set; its digest is unchanged.
    """
    return dataclasses.replace(identity, input_uris=uris)


def stage_identity(
    stage: StageName,
    version: int,
    config: dict[str, Any],
    inputs: Mapping[str, str],
    *,
    model: ModelSpec | None = None,
    key: str | None = None,
    code: Mapping[str, str] | None = None,
) -> StageIdentity:
    """The identity of a stage that runs on upstream artifacts, built the one way every such
    stage builds it.

    Args:
        stage: the stage kind.
        version: the stage module's STAGE_VERSION.
        config: its hashed config (registry.hashed_config).
        inputs: the fingerprints of its upstream artifacts, by input name.
        model: the recipe's model, hashed under "model" when the stage runs one.
        key: the name the config is hashed under (default: `stage`).
        code: the digests of the user code it runs (rewards.reward_sources).

    Returns:
        The identity: `config` under `key`, then `model`; `inputs`, then `code`.
    """
    hashed = {key or stage: config}
    if model is not None:
        hashed["model"] = model.model_dump(mode="json")
    return StageIdentity(stage, version, hashed, {**inputs, **(code or {})})


def identity_changes(old: dict[str, Any], new: StageIdentity) -> list[drift.Change]:
    """What changed from a directory's identity to `new`: config, code and source data.

    Upstream fingerprints are not drift (an upstream stage that ran again is not a change
    of this stage's recipe).

    Args:
        old: the earlier directory's identity.json, as read.
        new: the identity the stage has now.

    Returns:
        The changes, config first, then code (stage version, a user's rewards' sources), then
        source data.
    """
    changes = drift.diff(old["config"], new.config)
    if old["version"] != new.version:
        changes.append(drift.Change(f"code.{new.stage}_version", old["version"], new.version))
    old_sources, new_sources = _source_inputs(old["inputs"]), _source_inputs(new.inputs)
    code = drift.diff(_code(old_sources), _code(new_sources), "code.rewards")
    data = {k: v for k, v in old_sources.items() if not k.startswith(REWARD_SOURCE)}
    now = {k: v for k, v in new_sources.items() if not k.startswith(REWARD_SOURCE)}
    return changes + code + drift.diff(data, now, "data.source_content")


def _code(sources: dict[str, str]) -> dict[str, str]:
    """A user's rewards' source digests among the identity's sources, by reward name."""
    return {
        k.removeprefix(REWARD_SOURCE).split(":", 1)[0]: v
        for k, v in sources.items()
        if k.startswith(REWARD_SOURCE)
    }


def _source_inputs(inputs: dict[str, str]) -> dict[str, str]:
    """The identity's external sources, by label (upstream artifacts left out)."""
    return {
        k.removeprefix(SOURCE_PREFIX): v for k, v in inputs.items() if k.startswith(SOURCE_PREFIX)
    }
