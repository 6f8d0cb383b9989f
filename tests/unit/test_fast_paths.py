"""stages/modeling/fast_paths.py: importing FAR leaves Tunix and qwix as they ship; a stage's
fast paths are FAR's functions inside its scope and Tunix's again after it.

The originals are read in a fresh interpreter that imports Tunix and qwix first, so nothing this
test process imported earlier can have replaced them before they are recorded."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from stages.modeling import fast_paths, tunix_compat

# every attribute a fast path swaps, as "module:Owner.attribute" or "module:attribute"
SWAPPED = {
    "lora_backward": ["qwix._src.providers.lora:_compute_lora_delta"],
    "prefill_last_position": ["tunix.models.gemma3.model:Gemma3.__call__"],
    "completion_logps": [
        "tunix.rl.common:compute_per_token_logps",
        "tunix.rl.algo_core:compute_entropy_from_logits",
    ],
    "draw": ["tunix.generate.sampler:Sampler._sample"],
    "vocab_table": ["tunix.models.gemma3.model:Embedder.decode"],
}
TARGETS = [target for targets in SWAPPED.values() for target in targets]

_IDENTITY_CHILD = """
import importlib, json, sys
def resolve(target):
    module, _, path = target.partition(":")
    value = importlib.import_module(module)
    for part in path.split("."):
        value = getattr(value, part)
    return value
targets = json.loads(sys.argv[1])
before = [resolve(t) for t in targets]
import stages, stages.modeling.tunix_compat, stages.modeling.fast_paths, flows.cli  # noqa
import stages.sft, stages.grpo, stages.evaluate, stages.dpo, stages.distill, stages.self_teach
print(json.dumps([t for t, was in zip(targets, before) if resolve(t) is not was]))
"""


def resolve(target: str) -> Any:
    import importlib

    module, _, path = target.partition(":")
    value: Any = importlib.import_module(module)
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_importing_far_changes_nothing_in_tunix_or_qwix() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _IDENTITY_CHILD, json.dumps(TARGETS)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_every_swap_is_listed_here() -> None:
    assert set(SWAPPED) == set(fast_paths.PATHS)
    for name, targets in SWAPPED.items():
        swaps = fast_paths.PATHS[name]()
        assert [getattr(s.owner, s.name) for s in swaps] == [resolve(t) for t in targets], name


@pytest.mark.parametrize("name", sorted(SWAPPED))
def test_inside_the_scope_fars_and_after_it_tunixs_again(name: str) -> None:
    originals = [resolve(target) for target in SWAPPED[name]]
    replacements = [getattr(tunix_compat, swap.replacement) for swap in fast_paths.PATHS[name]()]
    with fast_paths.installed(name):
        assert fast_paths.active(name)
        assert [resolve(target) for target in SWAPPED[name]] == replacements
        assert all(r is not o for r, o in zip(replacements, originals, strict=True))
    assert not fast_paths.active(name)
    assert all(resolve(t) is o for t, o in zip(SWAPPED[name], originals, strict=True))


def test_a_stage_entry_runs_inside_its_scope_and_restores_on_an_error() -> None:
    original = resolve(SWAPPED["draw"][0])
    seen: list[Any] = []

    @fast_paths.scoped("draw")
    def stage() -> None:
        seen.append(resolve(SWAPPED["draw"][0]))
        raise KeyError("the stage failed")

    with pytest.raises(KeyError):
        stage()
    assert seen == [tunix_compat._sample_by_draw]
    assert resolve(SWAPPED["draw"][0]) is original


def test_overlapping_holders_share_one_install_and_the_last_restores() -> None:
    """Two stages on threads of one process: the first to leave does not pull the fast path
    from under the other."""
    original = resolve(SWAPPED["completion_logps"][0])
    entered, leave = threading.Event(), threading.Event()
    during: list[Any] = []

    def other_stage() -> None:
        with fast_paths.installed("completion_logps"):
            entered.set()
            leave.wait(10)
            during.append(resolve(SWAPPED["completion_logps"][0]))

    thread = threading.Thread(target=other_stage)
    thread.start()
    entered.wait(10)
    with fast_paths.installed("completion_logps"):
        pass
    leave.set()
    thread.join(10)
    assert during == [tunix_compat.completion_per_token_logps]
    assert resolve(SWAPPED["completion_logps"][0]) is original


def test_an_unknown_fast_path_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="expected some of"), fast_paths.installed("warp"):
        pass
