"""Greedy and sampled accuracy of one SFT checkpoint, through the evaluation's sampler and
through GRPO's rollout engine, on the same held-out prompts.

Why: GRPO can only reinforce answers its rollouts sample. When GRPO's rollout rewards are far
below the greedy evaluation, this tells a rollout defect (the two samplers disagree) from a
policy that samples badly (both agree). Reads the run's data_prep and sft records.

    JAX_PLATFORMS=cpu .venv/bin/python -m experiments.sampled_accuracy runs/r17 --prompts 48 \
        --samples 4 --temperature 0.5
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from typing import Any

import numpy as np
from tunix.rl.rollout import base_rollout

from schemas.artifacts import CheckpointArtifact, DatasetArtifact
from schemas.recipe import MeshSpec
from stages import rewards
from stages.core.datasets import load_prompts
from stages.evaluate.evaluation import correctness
from stages.modeling import generation, models, tunix_compat
from stages.modeling.tokenizers import build_tokenizer

MAX_TOKENS = 32


def stage_output(run: str, stage: str) -> dict[str, Any]:
    """The output of the run's one committed `stage` (its stage.json)."""
    found = glob.glob(os.path.join(run, f"{stage}-*", "stage.json"))
    if len(found) != 1:
        raise SystemExit(f"expected one committed {stage} stage in {run}, found {found}")
    with open(found[0]) as f:
        return dict(json.load(f)["output"])


def accuracy(rows: list[dict[str, Any]], completions: list[str]) -> float:
    _, correct = correctness(rows, completions, rewards.SandboxStats("bwrap", 1))
    return float(np.mean(correct))


def rollout_texts(policy: Any, tok: Any, mesh: Any, prompts: list[str], prompt_len: int, t: float):
    """Completions from GRPO's rollout engine (SeededRollout), 8 prompts per call."""
    config = base_rollout.RolloutConfig(
        max_tokens_to_generate=MAX_TOKENS,
        max_prompt_length=prompt_len,
        kv_cache_size=prompt_len + MAX_TOKENS + 8,
        temperature=t,
        top_p=1.0,
        top_k=None,
        eos_tokens=[tok.eos_id(), tok.end_of_turn_id()],
    )
    engine = tunix_compat.SeededRollout(
        policy, tok, mesh, config, seed_of=lambda step, call: 1000 * step + call
    )
    engine.follow(lambda: 0)
    texts: list[str] = []
    for start in range(0, len(prompts), 8):
        texts += list(engine.generate(prompts[start : start + 8], config).text)
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a FAR run directory holding data_prep-* and sft-* stages")
    parser.add_argument("--prompts", type=int, default=48, help="held-out prompts (eval split)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/far"))
    args = parser.parse_args()
    sft = CheckpointArtifact.model_validate(stage_output(args.run, "sft"))
    dataset = DatasetArtifact.model_validate(stage_output(args.run, "data_prep"))
    tok = build_tokenizer(sft.model, args.cache_dir)
    mesh = models.build_mesh(MeshSpec(fsdp=1, tp=1))
    rows = load_prompts(dataset, "eval")[: args.prompts]
    repeated = [r for r in rows for _ in range(args.samples)]
    prompts = [r["prompt"] for r in repeated]
    policy = models.restore_policy(
        sft, models.build_base_model(sft.model, mesh, args.cache_dir), mesh
    )
    sampler = generation.build_sampler(policy, tok, sft.model, dataset.prompt_len, MAX_TOKENS)
    common = {"prompt_len": dataset.prompt_len, "max_tokens": MAX_TOKENS, "batch_size": 16}
    greedy = generation.generate(
        sampler, tok, [r["prompt"] for r in rows], temperature=0.0, seed=0, **common
    )
    sampled = generation.generate(
        sampler, tok, prompts, temperature=args.temperature, seed=1, **common
    )
    rolled = rollout_texts(policy, tok, mesh, prompts, dataset.prompt_len, args.temperature)
    n = len(repeated)
    print(f"greedy                      {accuracy(rows, greedy):.3f}  ({len(rows)} prompts)")
    print(f"evaluation sampler, T {args.temperature}  {accuracy(repeated, sampled):.3f}  ({n})")
    print(f"GRPO rollout engine, T {args.temperature} {accuracy(repeated, rolled):.3f}  ({n})")


if __name__ == "__main__":
    main()
