"""grpo.share_prompts in the rollout: Tunix's GRPO learner hands the sampler each prompt
num_generations times and its prefill runs every copy through the model.
tunix_compat._prefill_sharing_prompts runs Tunix's prefill on one row of each run of equal
prompts and draws the first token for every row: the same completions, for a prefill of
1/group of the rows."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from stages.modeling import generation, tunix_compat
from tests.unit.test_prefill_last_position import base_and_tokenizer, lora_clone

GROUP = 4
PROMPTS = [p for p in ("What is 3 + 4?", "What is 12 * 7?") for _ in range(GROUP)]


def test_prompt_runs_are_equal_prompts_in_runs_of_the_group() -> None:
    assert tunix_compat.prompt_runs(PROMPTS, GROUP)
    assert tunix_compat.prompt_runs(PROMPTS, 2)  # runs of 4 are runs of 2
    assert not tunix_compat.prompt_runs(PROMPTS, 3)  # 8 rows are not runs of 3
    assert not tunix_compat.prompt_runs(PROMPTS[1:] + PROMPTS[:1], GROUP)
    assert not tunix_compat.prompt_runs(PROMPTS, 1)
    assert not tunix_compat.prompt_runs([], GROUP)


def sample(sampler: Any, shared: bool) -> Any:
    if shared:
        sampler._compiled_prefill_fn = jax.jit(
            functools.partial(tunix_compat._prefill_sharing_prompts, sampler, GROUP),
            donate_argnums=(1,),
            static_argnames=("echo",),
        )
    return sampler(
        input_strings=PROMPTS,
        max_generation_steps=12,
        max_prompt_length=16,
        echo=False,
        temperature=1.0,
        top_p=1.0,
        seed=5,
        return_logprobs=True,
    )


def test_the_shared_prefill_samples_the_same_completions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe, base, tokenizer = base_and_tokenizer(tmp_path)
    network = lora_clone(recipe, base)
    runs: list[int] = []  # the rows each traced prefill runs the model on
    real = tunix_compat.TUNIX_PREFILL

    def spy(sampler: Any, params: Any, state: Any, *args: Any) -> Any:
        runs.append(state.token_buffer.shape[0])
        return real(sampler, params, state, *args)

    monkeypatch.setattr(tunix_compat, "TUNIX_PREFILL", spy)
    tunix = sample(generation.build_sampler(network, tokenizer, recipe.model, 16, 12), False)
    shared_sampler = generation.build_sampler(network, tokenizer, recipe.model, 16, 12)
    shared = sample(shared_sampler, True)
    assert runs == [len(PROMPTS) // GROUP]  # Tunix's own prefill is not the spied name
    assert shared.text == tunix.text
    for a, b in zip(shared.logprobs, tunix.logprobs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # the first token is drawn for every row: a group's completions are not one repeated
    assert len(set(tunix.text[:GROUP])) > 1 and len(set(tunix.text[GROUP:])) > 1
