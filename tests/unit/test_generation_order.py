"""Greedy generation in length order (generation.generate `by_length`, which evaluation uses):
a batch decodes until its longest completion ends, so batches of like-length prompts stop
sooner; each completion is the one the prompts' own order gives, bit for bit, and comes back
in that order, across a session that stops and one that reads its kept batches back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stages.modeling import generation, models
from stages.modeling.tokenizers import build_tokenizer
from tests.conftest import recipe_with

# lengths that interleave, so the length order puts other prompts beside each one (the smoke
# model's tokenizer is bytes: each under the 64-token prompt length)
PROMPTS = [
    "Add 1 and 2.",
    "What is 13 + 29 + 40 + 2 + 5 + 61, step by step?",
    "7 - 7?",
    "Calculate 40 * 2 - 9 + 3 and say how.",
    "5 + 61",
    "Take 8 from 3, add 4 times 6, then halve it.",
]


class Stopping:
    """A BatchStore kept in memory whose session ends before batch `stop_at`."""

    def __init__(self, kept: dict[int, list[str]], stop_at: int | None) -> None:
        self.kept, self.stop_at = kept, stop_at

    def load(self, number: int) -> list[str] | None:
        return self.kept.get(number)

    def before_batch(self, number: int) -> None:
        if number == self.stop_at:
            raise TimeoutError(f"session over before batch {number}")

    def save(self, number: int, completions: list[str]) -> None:
        self.kept[number] = completions


def decode(
    sampler: Any, tokenizer: Any, by_length: bool, store: Any = None, temperature: float = 0.0
) -> list[str]:
    return generation.generate(
        sampler,
        tokenizer,
        PROMPTS,
        prompt_len=64,
        max_tokens=12,
        batch_size=2,
        temperature=temperature,
        seed=0,
        store=store,
        by_length=by_length,
    )


@pytest.fixture(scope="module")
def sampler_and_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    root = tmp_path_factory.mktemp("order")
    recipe = recipe_with(str(root), "smoke")
    network = models.build_base_model(recipe.model, models.build_mesh(recipe.mesh), str(root))
    tokenizer = build_tokenizer(recipe.model, str(root))
    return generation.build_sampler(network, tokenizer, recipe.model, 64, 12), tokenizer


def test_length_order_is_shortest_first_and_stable(tmp_path: Path) -> None:
    tokenizer = build_tokenizer(recipe_with(str(tmp_path), "smoke").model, str(tmp_path))
    order = generation.length_order(tokenizer, ["aaaa", "a", "bbbb", "bb"])
    assert order == [1, 3, 0, 2]  # equal lengths ("aaaa", "bbbb") keep their order


def test_the_length_order_gives_the_same_completions_in_the_prompts_order(
    sampler_and_tokenizer: tuple[Any, Any],
) -> None:
    sampler, tokenizer = sampler_and_tokenizer
    order = generation.length_order(tokenizer, PROMPTS)
    assert order != sorted(order)  # the batches hold other neighbours than in the given order
    as_given = decode(sampler, tokenizer, by_length=False)
    assert decode(sampler, tokenizer, by_length=True) == as_given
    assert len(set(as_given)) > 1  # not one text for every prompt


def test_a_stopped_session_resumes_its_length_ordered_batches(
    sampler_and_tokenizer: tuple[Any, Any],
) -> None:
    sampler, tokenizer = sampler_and_tokenizer
    kept: dict[int, list[str]] = {}
    with pytest.raises(TimeoutError):
        decode(sampler, tokenizer, True, Stopping(kept, stop_at=2))
    assert sorted(kept) == [0, 1]
    shortest = generation.length_order(tokenizer, PROMPTS)[:2]
    as_given = decode(sampler, tokenizer, False)
    assert kept[0] == [as_given[i] for i in shortest]  # batches numbered in length order
    assert decode(sampler, tokenizer, True, Stopping(kept, stop_at=None)) == as_given
    assert sorted(kept) == [0, 1, 2]
    kept[0] = ["kept first", "kept second"]  # read back, not made again, and put in place
    read_back = decode(None, tokenizer, True, Stopping(kept, stop_at=None))
    assert [read_back[i] for i in shortest] == kept[0]


def test_a_sampled_call_keeps_the_given_order(sampler_and_tokenizer: tuple[Any, Any]) -> None:
    sampler, tokenizer = sampler_and_tokenizer
    with pytest.raises(ValueError, match="sampled prompt's draws"):
        decode(sampler, tokenizer, True, temperature=1.0)
