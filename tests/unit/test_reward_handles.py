"""A user's reward gets no handle to the run it scores for: what each reward form receives
when GRPO calls it (through the callables Tunix calls, with the stage's own sandbox settings
and call limit) names no path of the run and holds no RunContext.

A reward runs in FAR's process by design, so this is what FAR hands it, not a boundary
(docs/threat-model.md says what a reward may touch).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from stages import rewards
from stages.core.runner import RunContext

SEEN: list[Any] = []


def per_completion(completion: str, ref: rewards.Reference) -> float:
    SEEN.append((completion, ref))
    return 1.0


def trl_batch(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    SEEN.append((prompts, completions, columns))
    return [1.0] * len(completions)


def sandboxed(
    completions: Sequence[str], refs: Sequence[rewards.Reference], stats: rewards.SandboxStats
) -> list[float]:
    SEEN.append((completions, refs, stats))
    return [1.0] * len(completions)


@pytest.fixture
def registered() -> Iterator[dict[str, float]]:
    names = {"handles_pair": per_completion, "handles_trl": trl_batch}
    for name, fn in names.items():
        rewards.register_reward(name, fn)
    rewards.register_reward("handles_sandboxed", sandboxed, batch=True)
    yield {name: 1.0 for name in [*names, "handles_sandboxed"]}
    for name in [*names, "handles_sandboxed"]:
        rewards.unregister_reward(name)


def _reachable(value: Any, depth: int = 0) -> Iterator[Any]:
    """Every object `value` leads to through containers, dataclass fields and attributes."""
    yield value
    if depth > 8 or isinstance(value, str | bytes | int | float | bool | type(None)):
        return
    if isinstance(value, dict):
        children: list[Any] = [*value.keys(), *value.values()]
    elif isinstance(value, list | tuple | set | frozenset):
        children = list(value)
    else:
        fields = dataclasses.fields(value) if dataclasses.is_dataclass(value) else ()
        attributes = getattr(value, "__dict__", {})
        children = [*(getattr(value, f.name) for f in fields), *attributes.values()]
    for child in children:
        yield from _reachable(child, depth + 1)


def test_no_reward_form_receives_a_handle_to_the_run(
    tmp_path: Path, registered: dict[str, float]
) -> None:
    ctx = RunContext(str(tmp_path / "runs"), "scored")
    stage = f"{ctx.run_uri}/grpo-0123abcd"
    row = {"answer": "dro3w", "tests": [], "columns": {"q": "Reverse w3ord", "a": "dro3w"}}
    SEEN.clear()
    for fn in rewards.tunix_reward_fns(registered, rewards.stats_for(ctx), "answer"):
        fn(
            prompts=["<start_of_turn>user\nReverse w3ord<end_of_turn>\n<start_of_turn>model\n"],
            completions=["<answer>dro3w</answer>"],
            answer=[row["answer"]],
            tests=[json.dumps(row["tests"])],
            columns=[json.dumps(row["columns"])],
        )
    assert len(SEEN) == 3  # each form was called
    found = [obj for call in SEEN for obj in _reachable(call)]
    assert not any(isinstance(obj, RunContext) for obj in found)
    texts = [obj for obj in found if isinstance(obj, str | Path)]
    for path in (str(tmp_path), ctx.run_uri, stage):
        assert not any(path in str(text) for text in texts), path
