"""GRPO in full on the tiny model: kill -9 and re-run equals an uninterrupted run (bitwise),
per-step rollout seeds that a resume reproduces, the Tunix resume defects we work around,
per-step metrics (TensorBoard, record history, samples.jsonl) and a reward that is learned."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx
from tunix.models.gemma3 import model as gemma3_model

from schemas.recipe import HardSubsetConfig
from schemas.record import StageRecord
from stages import hard_subset, rewards, sft
from stages.core import storage
from stages.core.datasets import load_prompts
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.evaluate import evaluation as evaluate
from stages.grpo import metrics as grpo_metrics
from stages.grpo import training as grpo
from stages.modeling import tunix_compat
from tests.conftest import REPO, recipe_with
from tests.integration._grpo_child import GRPO_STEPS, child_recipe
from tests.integration.test_sft_full import lora_leaves

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sft_start(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The child recipe's data-prep and SFT, committed once: (data-prep record, SFT record).
    The kill -9 test's uninterrupted, killed and resumed GRPO sessions all start from it."""
    root = str(tmp_path_factory.mktemp("grpo-start"))
    recipe = child_recipe(root)
    ctx = RunContext(root=root, run="child")
    prepared = data_prep.prepare(recipe.data, recipe.model, ctx)  # type: ignore[attr-defined]
    trained = sft.train(prepared.output, recipe.sft, recipe.model, recipe.mesh, ctx)  # type: ignore[attr-defined]
    return prepared.record_uri, trained.record_uri


def run_child(root: Path, start: tuple[str, str]) -> subprocess.Popen[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration._grpo_child", str(root), *start],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def grpo_record(root: Path) -> StageRecord:
    records = list(root.glob("child/grpo-*/stage.json"))
    assert len(records) == 1, records
    return StageRecord.model_validate(storage.read_json(str(records[0])))


def seeds_by_step(root: Path) -> dict[int, int]:
    (samples,) = root.glob("child/grpo-*/samples.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    return {row["step"]: row["rollout_seed"] for row in rows}


def test_kill_9_then_rerun_equals_an_uninterrupted_run(
    tmp_path: Path, sft_start: tuple[str, str]
) -> None:
    straight = run_child(tmp_path / "straight", sft_start)
    assert straight.wait(timeout=400) == 0, straight.stdout.read()  # type: ignore[union-attr]
    victim = run_child(tmp_path / "killed", sft_start)
    actor = tmp_path / "killed" / "child"
    deadline = time.time() + 300
    while not list(actor.glob("grpo-*/checkpoints/actor/3")):
        assert victim.poll() is None, "finished before it could be killed"
        assert time.time() < deadline, "no GRPO checkpoint appeared"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not list(actor.glob("grpo-*/stage.json"))  # not committed
    resumed = run_child(tmp_path / "killed", sft_start)
    output = resumed.communicate(timeout=400)[0]
    assert resumed.returncode == 0, output
    record, reference = grpo_record(tmp_path / "killed"), grpo_record(tmp_path / "straight")
    start = int(record.metrics["resumed_from_step"])
    assert 3 <= start < GRPO_STEPS
    # the killed session kept no curves: the record's history begins where it resumed, and
    # says so
    assert record.metrics["history_from_step"] == start
    # some reward was earned, so the policy gradient was not zero everywhere
    assert max(reference.history["rewards/sum"]) > 0
    # the KL reference is the starting (SFT) policy: 0 at the first update (the actor still is
    # that policy), then the policy moves away from it (beta 0.04 keeps it near)
    kl = reference.history["kl"]
    assert all(np.isfinite(kl)) and abs(kl[0]) < 1e-5 and max(kl) > 1e-4, kl
    expected = lora_leaves(reference.output)  # type: ignore[arg-type]
    got = lora_leaves(record.output)  # type: ignore[arg-type]
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
    # the resumed session continued at the restored global step, with the same seeds
    assert record.history["global_step"][0] == start
    # and the same groups: the informative-group fraction of every resumed step is the
    # uninterrupted run's (the difficulty filter's log resumes with the run)
    informative = reference.history[grpo_metrics.INFORMATIVE]
    assert len(informative) == GRPO_STEPS
    assert record.history[grpo_metrics.INFORMATIVE] == informative[start:]
    # (samples of the killed session died with it; the resumed session's are kept)
    seeds, resumed_seeds = seeds_by_step(tmp_path / "straight"), seeds_by_step(tmp_path / "killed")
    assert sorted(resumed_seeds) == list(range(start, GRPO_STEPS))
    assert resumed_seeds == {step: seeds[step] for step in resumed_seeds}
    # a new sampling seed every step (Tunix alone reuses one PRNG key for every step)
    assert len(set(seeds.values())) == GRPO_STEPS


def test_resume_fixes_tunix_global_step_and_rollout_weights(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(REPO),
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration._grpo_resume_child", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("REPORT "))
    apart, shared = (json.loads(line.removeprefix("REPORT "))[k] for k in ("apart", "shared"))
    # the step-3 checkpoint of a cleanly finished run: Tunix restores global step 0
    assert apart["restored_step"] == 3 and apart["global_step_before"] == 0
    assert apart["global_step_after"] == 3 and shared["global_step_after"] == 3
    # a rollout model on its own device still holds the SFT adapters until the resync
    assert apart["rollout_diff_before"] > 0 and apart["rollout_diff_after"] == 0
    # a rollout that shares the actor's variables still does after the resync (a sync would
    # replace them with copies that Tunix never updates again: stale rollouts all session)
    assert shared["rollout_diff_after"] == 0 and shared["rollout_follows_actor_after"]


def assert_metrics_landed(outcome: object, steps: int, max_tokens: int) -> StageRecord:
    """Per-step metrics in the record's history, TensorBoard files, samples.jsonl."""
    record = StageRecord.model_validate(storage.read_json(outcome.record_uri))  # type: ignore[attr-defined]
    history = record.history
    for name in (
        "rewards/format_strict",
        "rewards/answer_match",
        "rewards/sum",
        "far/zero_variance_groups",
        "far/format_rate",
        "kl",
        "completions/mean_length",
        "completions/max_length",
    ):
        assert len(history[name]) == steps, (name, history[name])
    fractions = history["far/zero_variance_groups"] + history["far/format_rate"]
    assert all(0 <= x <= 1 for x in fractions)
    assert all(np.isfinite(x) and x >= 0 for x in history["kl"])
    lengths = zip(
        history["completions/mean_length"], history["completions/max_length"], strict=True
    )
    assert all(0 < mean <= longest <= max_tokens for mean, longest in lengths)
    stage_dir = Path(outcome.output.uri).parents[1]  # type: ignore[attr-defined]
    assert list(stage_dir.glob("tensorboard/events.out.tfevents*"))
    rows = [json.loads(x) for x in (stage_dir / "samples.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == list(range(steps)) and len(rows) == steps * 4
    assert all(r["prompt"].endswith("model\n") and isinstance(r["completion"], str) for r in rows)
    assert any(r["completion"] for r in rows)
    return record


def letter_fraction(completions: Sequence[str], refs: object, stats: object) -> list[float]:
    """Share of a completion's characters that are ASCII letters (dense; learnable)."""
    return [sum(ch.isascii() and ch.isalpha() for ch in c) / max(len(c), 1) for c in completions]


def test_a_learnable_reward_rises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A test-only reward; full weights at temperature 1 (full weights can grow the output
    # embedding and sharpen the policy; LoRA cannot: see the LoRA test below).
    reward = rewards.Reward("letter_fraction", letter_fraction, "test-only")
    monkeypatch.setitem(rewards.REGISTRY, "letter_fraction", reward)
    recipe = recipe_with(
        str(tmp_path),
        sft={"max_steps": 4, "lora": None},
        grpo={
            "max_steps": 20,
            "checkpoint_every_steps": 1000,
            "learning_rate": 3e-3,
            "beta": 0.0,
            "temperature": 1.0,
            "max_generation_tokens": 16,
            "rewards": {"letter_fraction": 1.0, "format_strict": 0.0, "answer_match": 0.0},
        },
    )
    ctx = RunContext(str(tmp_path), "learn")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    policy = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output
    outcome = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)
    curve = assert_metrics_landed(outcome, 20, 16).history["rewards/letter_fraction"]
    # measured: 0.31 in the first five steps, 0.72 in the last five
    assert np.mean(curve[-5:]) > np.mean(curve[:5]) + 0.15, curve


LEARN_STEPS = 20


@pytest.fixture(scope="module")
def lora_sft(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, str]:
    """One LoRA SFT policy (4 steps) for every seed of the LoRA learning test."""
    root = str(tmp_path_factory.mktemp("lora-learn"))
    recipe = recipe_with(root, sft={"max_steps": 4})
    ctx = RunContext(root, "sft")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    return dataset, sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output, root


LETTER_BAR = 0.35  # "sometimes" prompts: the 4-step SFT policy at 0.3 meets it about half the time


def letter_bar(answer: str) -> float:
    """A prompt's bar, from its answer: 0 (always met), 2 (never), or LETTER_BAR."""
    kind = int(hashlib.sha256(answer.encode()).hexdigest(), 16) % 3
    return (0.0, 2.0, LETTER_BAR)[kind]


def banded_letters(completions: Sequence[str], refs: Any, stats: object) -> list[float]:
    """1.0 when a completion's letter share reaches its prompt's bar (test-only): a third of
    the prompts are always solved, a third never, a third sometimes, so only a third of the
    GRPO groups carry a gradient unless the difficulty filter drops the others."""
    shares = letter_fraction(completions, refs, stats)
    return [float(s >= letter_bar(r.answer)) for s, r in zip(shares, refs, strict=True)]


def banded_recipe(root: str, seed: int, **grpo_changes: Any) -> Any:
    return recipe_with(
        root,
        sft={"max_steps": 4},
        grpo={
            **grpo_changes,
            "max_steps": LEARN_STEPS,
            "checkpoint_every_steps": 1000,
            "learning_rate": 3e-3,
            "beta": 0.0,
            "temperature": 0.3,
            "max_generation_tokens": 16,
            "seed": seed,
            "rewards": {"banded_letters": 1.0},
        },
    )


@pytest.fixture(scope="module")
def filtered(lora_sft: tuple[Any, Any, str]) -> Iterator[Any]:
    """The 4-step SFT policy's training prompts kept by the difficulty filter: an evaluation
    samples 4 completions a prompt at the GRPO temperature and scores them with the GRPO
    reward; hard_subset keeps the prompts solved sometimes (0 < rate < 1)."""
    dataset, policy, root = lora_sft
    with pytest.MonkeyPatch.context() as patch:
        register_test_rewards(patch)
        recipe, ctx = banded_recipe(root, 0), RunContext(root, "filter")
        probe = recipe.eval.model_copy(
            update={
                "models": ["sft"],
                "split": "grpo_train",
                "samples": 4,
                "temperature": 0.3,
                "max_generation_tokens": 16,
                "rewards": ["banded_letters"],
            }
        )
        report = evaluate.evaluate(dataset, {"sft": policy}, probe, recipe.model, recipe.mesh, ctx)
        band = HardSubsetConfig(
            model="sft", above=0.0, below=1.0, min_prompts=2, by="reward/banded_letters"
        )
        kept = hard_subset.select(report.output, dataset, band, ctx)
        yield kept.output


def register_test_rewards(patch: pytest.MonkeyPatch) -> None:
    for name, function in (
        ("banded_letters", banded_letters),
        ("letter_fraction", letter_fraction),
    ):
        patch.setitem(rewards.REGISTRY, name, rewards.Reward(name, function, "test-only"))


def banded_history(
    dataset: Any, policy: Any, root: str, seed: int, name: str, **grpo_changes: Any
) -> dict[str, list[float]]:
    """The per-step metrics of a banded-reward GRPO run (its record's history)."""
    recipe = banded_recipe(root, seed, **grpo_changes)
    ctx = RunContext(root, name)  # one run per dataset and seed (the drift guard)
    outcome = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)
    history = StageRecord.model_validate(storage.read_json(outcome.record_uri)).history
    assert len(history["rewards/banded_letters"]) == LEARN_STEPS
    if recipe.grpo.share_prompts:  # the phase timer sees the prefill SeededRollout picks
        assert min(history["far/seconds/rollout_prefill"]) > 0, history
    return history


def test_difficulty_filter_keeps_the_prompts_solved_sometimes(
    lora_sft: tuple[Any, Any, str], filtered: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filter drops the prompts whose bar is 0 or 2 (always or never met), and with the
    same seed the filtered run's groups carry a gradient far more often.

    The unfiltered run samples twice its batch a step (grpo.oversample 2): its update keeps 2
    of the 4 groups, informative first, so the update's informative share is the sampled
    one doubled, capped at 1, step by step; a wrong wiring (two updates a step, or a
    rollout of half the prompts) changes the step count or that share."""
    dataset, policy, root = lora_sft
    kept = filtered
    train = load_prompts(dataset, "grpo_train")
    rows = load_prompts(kept, "grpo_train")
    assert 2 <= len(rows) < len(train)
    assert all(letter_bar(r["answer"]) == LETTER_BAR for r in rows), rows
    assert load_prompts(kept, "eval") == load_prompts(dataset, "eval")  # held out, unchanged
    register_test_rewards(monkeypatch)
    oversampled = banded_history(dataset, policy, root, 0, "unfiltered", oversample=2)
    unfiltered = oversampled[grpo_metrics.INFORMATIVE]
    update = oversampled[grpo_metrics.UPDATE_INFORMATIVE]
    np.testing.assert_allclose(update, np.minimum(1.0, 2 * np.asarray(unfiltered)))
    # measured: sampled 0.263, update 0.525 (every step's sampled share was at most 1/2)
    assert np.mean(update) > 1.5 * np.mean(unfiltered), (update, unfiltered)
    informative = banded_history(kept, policy, root, 0, "filtered-0")[grpo_metrics.INFORMATIVE]
    # measured (seed 0, 20 steps): 0.925 filtered (2 groups a step), 0.263 unfiltered (4 groups
    # a step; 0.425 with 2, before oversample). Groups of 4 at a solve rate near 1/2 are
    # informative 1 - 2 / 16 = 0.875 of the time, and only the third of the unfiltered prompts
    # whose bar is LETTER_BAR can be (a 2-group step's fraction has sd ~0.35, so a 20-step mean
    # ~0.08, and the difference ~0.11: 0.3 is under the measured 0.66 by more than 3 of those)
    assert np.mean(informative) > np.mean(unfiltered) + 0.3, (informative, unfiltered)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lora_grpo_learns_a_learnable_reward_through_the_filter(
    seed: int,
    lora_sft: tuple[Any, Any, str],
    filtered: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LoRA GRPO raises a learnable reward on the filtered prompts on 3 seeds (prompt order
    and rollout sampling).

    Sampling runs at temperature 0.3: the random tiny model's tied output embedding is so
    small (std 0.02, so every logit lies within about +-1.5 of the others) that at
    temperature 1 every policy reachable by adapters below the final norm samples nearly
    uniform bytes (policy entropy 6.21 nats of ln 512 = 6.24; the most letter-heavy hidden
    state raises the per-token letter mass from 0.102 to 0.121 only), so LoRA had nothing to
    learn there; at 0.3 the same bound allows 0.21. The rollout does sample from the live
    adapters (the sampler holds the actor's own variables: the test below).
    Measured, mean reward of the first five steps -> the last five: seed 0 0.50 -> 0.73,
    seed 1 0.58 -> 0.88, seed 2 0.53 -> 1.00 (unfiltered, seed 0: 0.43 -> 0.53).
    Margin: a step's mean of 8 binary rewards varies with sd ~0.16 (seed 0's first ten
    steps), so the difference of two 5-step means has sd ~0.10; 0.15 is 1.5 of those below
    the smallest rise measured. The runs are deterministic on a machine (seeded rollouts),
    so the margin guards against a code change that slows learning, not run-to-run noise.
    Seed 2 runs with the speed settings (share_prompts, trim_padding, draw inverse_cdf,
    sampler_projection bfloat16): its rollout prefill and actor update take the shared-prompt
    paths and its rollout the bfloat16 table (counted here), and it learns too (measured
    with them: 0.55 -> 1.00, before sampler_projection; the 0.53 -> 1.00 above is without).
    """
    _, policy, root = lora_sft
    kept = filtered
    register_test_rewards(monkeypatch)
    fast = seed == 2
    changes = (
        {
            "share_prompts": True,
            "trim_padding": 4,
            "draw": "inverse_cdf",
            "sampler_projection": "bfloat16",
        }
        if fast
        else {}
    )
    traced = count_shared_prompt_paths(monkeypatch)
    history = banded_history(kept, policy, root, seed, f"filtered-{seed}", **changes)
    curve = history["rewards/banded_letters"]
    assert np.mean(curve[-5:]) > np.mean(curve[:5]) + 0.15, curve
    # traced once per compiled shape: the prefill (one), the actor update (a trimmed width each),
    # the rollout's projection through the bfloat16 table (prefill and decode step)
    assert (
        (traced["prefill"] >= 1 and traced["actor"] >= 1 and traced["vocab_table"] >= 2)
        if fast
        else not any(traced.values())
    ), traced


def count_shared_prompt_paths(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times the rollout's shared prefill, the actor's shared-prompt pass and the
    rollout's bfloat16 projection are traced from now on (each once per compiled shape)."""
    traced = {"prefill": 0, "actor": 0, "vocab_table": 0}
    real_decode = tunix_compat._embedder_decode

    def decode(self: Any, x: Any) -> Any:
        traced["vocab_table"] += getattr(self, "vocab_table", None) is not None
        return real_decode(self, x)

    # the stage's fast path "vocab_table" installs _embedder_decode, read when it is entered
    monkeypatch.setattr(gemma3_model.Embedder, "decode", gemma3_model.Embedder.decode)
    monkeypatch.setattr(tunix_compat, "_embedder_decode", decode)
    for key, name in (
        ("prefill", "_prefill_sharing_prompts"),
        ("actor", "_hidden_sharing_prompts"),
    ):
        real = getattr(tunix_compat, name)

        def counting(*args: Any, _real: Any = real, _key: str = key, **kwargs: Any) -> Any:
            traced[_key] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(tunix_compat, name, counting)
    return traced


def test_rollout_samples_from_the_adapters_being_trained(
    lora_sft: tuple[Any, Any, str], tmp_path: Path
) -> None:
    """At every rollout of a real LoRA GRPO run (one mesh), the sampler reads the very
    variables the trainer updates: its adapters equal the actor's and have moved by then."""
    dataset, policy, root = lora_sft
    recipe = recipe_with(root, sft={"max_steps": 4}, grpo={"max_steps": 3, "learning_rate": 1e-2})
    session = grpo.build_session(
        str(tmp_path),
        dataset,
        policy,
        recipe.grpo,
        recipe.model,
        recipe.mesh,
        RunContext(root, "x"),
    )
    actor, rollout = session.cluster.actor_trainer.model, session.cluster.rollout
    start = [np.asarray(x) for x in jax.tree.leaves(nnx.state(actor, nnx.LoRAParam))]

    def largest_difference(a: list[Any], b: list[Any]) -> float:
        return max(
            float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(a, b, strict=True)
        )

    seen: list[tuple[float, float]] = []  # (sampler vs actor, sampler vs start) per rollout
    generate = rollout.generate

    def spy(prompts: list[str], config: Any, **kwargs: Any) -> Any:
        sampled = jax.tree.leaves(nnx.state(rollout.model(), nnx.LoRAParam))
        trained = jax.tree.leaves(nnx.state(actor, nnx.LoRAParam))
        seen.append(
            (
                largest_difference(sampled, trained),
                largest_difference(sampled, start),
            )
        )
        return generate(prompts, config, **kwargs)

    rollout.generate = spy  # type: ignore[method-assign]
    tunix_compat.skip_tunix_fast_forward(session.learner)
    rows = load_prompts(dataset, "grpo_train")
    with session.mesh:
        session.learner.train(itertools.islice(grpo.prompt_batches(rows, 2, 0), 3))
    assert len(seen) == 3 and all(diff == 0.0 for diff, _ in seen)
    # Adam at 1e-2 moves every adapter by about the learning rate per update
    assert seen[0][1] == 0.0 and seen[1][1] > 5e-3 and seen[2][1] > seen[1][1]
