"""`baseline: greedy` end to end on the tiny model: two GRPO steps whose record carries the
greedy reward per step, whose greedy completions are really greedy (the first step's equal a
separate greedy decode of the SFT checkpoint they started from), and whose sampled rollouts
keep their per-step seeds (the greedy decode draws none)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from schemas.record import StageRecord
from stages import sft
from stages.core import storage
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.grpo import metrics, rollouts
from stages.grpo import training as grpo
from stages.grpo.baseline import NAME
from stages.modeling import generation, models
from stages.modeling.tokenizers import build_tokenizer
from tests.conftest import recipe_with

pytestmark = pytest.mark.slow
STEPS = 2


def test_greedy_baseline_records_the_greedy_reward_of_real_greedy_decodes(
    tmp_path: Path,
) -> None:
    recipe = recipe_with(
        str(tmp_path),
        sft={"max_steps": 4},
        grpo={"max_steps": STEPS, "baseline": "greedy", "samples_per_step": 8},
    )
    ctx = RunContext(str(tmp_path), "t")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    policy = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output
    outcome = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)
    record = StageRecord.model_validate(storage.read_json(outcome.record_uri))
    for name in (metrics.GREEDY_REWARD, metrics.SAMPLE_REWARD, metrics.NONZERO_ADVANTAGE):
        assert len(record.history[name]) == STEPS, name
    assert f"{metrics.GREEDY_REWARD}/first" in record.metrics
    assert 0.0 <= record.metrics[f"{metrics.NONZERO_ADVANTAGE}/mean"] <= 1.0
    # the reward Tunix sums is R(sample) - R(greedy): score = sample + (-greedy), per step
    np.testing.assert_allclose(
        record.history[metrics.TOTAL_REWARD],
        np.add(record.history[metrics.SAMPLE_REWARD], record.history[f"rewards/{NAME}"]),
        atol=1e-6,
    )
    np.testing.assert_allclose(
        record.history[f"rewards/{NAME}"], np.negative(record.history[metrics.GREEDY_REWARD])
    )

    (samples,) = Path(tmp_path).glob("t/grpo-*/samples.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    for row in rows:  # call 0 of each step is the sampled rollout: the greedy call took no seed
        assert row["rollout_seed"] == rollouts.step_seed(recipe.grpo.seed, row["step"], 0)
    first = [row for row in rows if row["step"] == min(r["step"] for r in rows)]
    prompts = list(dict.fromkeys(row["prompt"] for row in first))
    assert len(prompts) == recipe.grpo.batch_size
    recorded = {row["prompt"]: row["greedy_completion"] for row in first}

    tokenizer = build_tokenizer(recipe.model, ctx.model_cache, ctx.shared)
    mesh = models.build_mesh(recipe.mesh)
    network = models.policy_network(policy, mesh, ctx.model_cache, ctx.shared)
    tokens = recipe.grpo.max_generation_tokens
    sampler = generation.build_sampler(network, tokenizer, recipe.model, dataset.prompt_len, tokens)
    decoded = generation.generate(
        sampler,
        tokenizer,
        prompts,
        prompt_len=dataset.prompt_len,
        max_tokens=tokens,
        batch_size=len(prompts),
        temperature=0.0,
        seed=0,
    )
    assert decoded == [recorded[p] for p in prompts]
