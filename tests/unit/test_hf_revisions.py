"""Hugging Face sources are pinned: the dataset's commit sha is resolved, hashed into the
data_prep identity, and a changed sha is drift the guard refuses.

The hub cannot be reached from here, so the resolver is a local table standing in for
huggingface_hub's dataset_info (its answer's `.sha`); the resolution rules around it are real.
"""

from __future__ import annotations

import pytest

from schemas.recipe import SourceSpec
from stages.core import drift
from stages.core.identity import identity_changes
from stages.data_prep import build as data_prep
from stages.data_prep.fingerprints import hf_fingerprint
from tests.conftest import recipe_with

SHA_A, SHA_B = "a" * 40, "b" * 40


class LocalHub:
    """Branches and tags of local datasets -> commit sha; unknown names fail like no network."""

    def __init__(self, refs: dict[tuple[str, str | None], str]) -> None:
        self.refs, self.asked = refs, 0

    def __call__(self, name: str, revision: str | None) -> str:
        self.asked += 1
        if (name, revision) not in self.refs:
            raise ConnectionError(f"no hub here for {name}@{revision}")
        return self.refs[(name, revision)]


def spec(revision: str | None = None) -> SourceSpec:
    return SourceSpec(kind="hf", name="org/math", config="main", adapter="gsm8k", revision=revision)


def test_default_branch_and_tags_resolve_to_their_commit() -> None:
    hub = LocalHub({("org/math", None): SHA_A, ("org/math", "v2"): SHA_B})
    assert hf_fingerprint(spec(), hub) == f"hub:org/math:main:train@{SHA_A}"
    assert hf_fingerprint(spec("v2"), hub) == f"hub:org/math:main:train@{SHA_B}"


def test_a_pinned_commit_needs_no_hub() -> None:
    hub = LocalHub({})
    assert hf_fingerprint(spec(SHA_B), hub) == f"hub:org/math:main:train@{SHA_B}"
    assert hub.asked == 0


def test_unreachable_hub() -> None:
    hub = LocalHub({})
    assert hf_fingerprint(spec(), hub) == "hub:org/math:main:train (unpinned)"
    with pytest.raises(ConnectionError, match=r"revision 'v2'.*pin a 40-hex commit sha"):
        hf_fingerprint(spec("v2"), hub)


def test_revision_is_for_hf_sources_only() -> None:
    with pytest.raises(ValueError, match=r"file source .* has revision 'main'"):
        SourceSpec(kind="file", name="x.jsonl", adapter="gsm8k", revision="main")


def test_a_changed_commit_is_drift() -> None:
    recipe = recipe_with("/tmp/far-hf")
    old = data_prep.identity(recipe.data, recipe.model)
    label = "source:hf:org/math"
    before = old.__class__(
        old.stage,
        old.version,
        old.config,
        {**old.inputs, label: hf_fingerprint(spec(SHA_A), LocalHub({}))},
    )
    after = old.__class__(
        old.stage,
        old.version,
        old.config,
        {**old.inputs, label: hf_fingerprint(spec(SHA_B), LocalHub({}))},
    )
    assert before.digest != after.digest
    recorded = {"config": before.config, "version": before.version, "inputs": before.inputs}
    changes = identity_changes(recorded, after)
    assert [c.path for c in changes] == ["data.source_content.hf:org/math"]
    with pytest.raises(drift.DriftError, match="hf:org/math"):
        drift.check("stage data_prep", changes, ())


def test_recipes_without_a_revision_dump_as_before() -> None:
    assert "revision" not in spec().model_dump(mode="json")
    assert spec("v2").model_dump(mode="json")["revision"] == "v2"
