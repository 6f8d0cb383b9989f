"""FAR's SFT and GRPO stages against the same training written as bare Tunix scripts.

Same model, data, batch shapes, LoRA, optimizer settings and step counts; the bare scripts
are written the way Tunix's examples are (build the model, qwix LoRA, PeftTrainer /
RLCluster + GRPOLearner, train on an iterator), with no records, guards, seeds, observers
or publishing. FAR runs through its stage entry points (stages.sft.train,
stages.grpo.training.reinforce) with a RunContext, each repetition in a new run directory. The
two alternate within one process (the order flips every repetition); one unmeasured warm-up
repetition of each comes first. Per repetition the ratio is FAR's wall time per step over
the bare script's, both from the call to the trained, saved result (model building and
compilation included, as a user waits for them). Both GRPO runs start from the same policy,
FAR's SFT checkpoint; they differ in their sampling seeds (FAR seeds each step, the bare script
uses Tunix's one key), so their completions, and so their rollout work, differ by chance.
`--far-untimed` adds FAR's GRPO without its per-phase timer, on the same seeds as FAR's.

    JAX_PLATFORMS=cpu .venv/bin/python -m bench.vs_tunix --reps 5
    flock /tmp/far-heavy.lock env JAX_PLATFORMS=cpu .venv/bin/python -m bench.vs_tunix \
        --recipe demo --sft-steps 6 --grpo-steps 2 --reps 3       # the real Gemma 3 270M
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# --- bare Tunix ------------------------------------------------------------------------------


def bare_model(recipe: Any, cache_dir: str) -> tuple[Any, Any]:
    """(mesh, base model), built with Tunix's own creators as its examples do."""
    import jax.numpy as jnp
    from tunix.models import dummy_model_creator
    from tunix.models.gemma3 import model as gemma3
    from tunix.models.gemma3 import params_safetensors
    from tunix.utils import mesh as tunix_mesh

    from stages.modeling import models, weight_sources

    mesh = tunix_mesh.create_mesh((1, 1), ("fsdp", "tp"))
    config = models.tunix_config(recipe.model)  # the same ModelConfig FAR builds
    dtype = jnp.dtype(recipe.model.dtype)
    if recipe.model.source == "random":
        model = dummy_model_creator.create_dummy_model(
            gemma3.Gemma3, config, mesh=mesh, dtype=dtype, random_seed=recipe.model.init_seed
        )
    else:
        directory = weight_sources.resolve(recipe.model, cache_dir)  # the converted HF files
        with mesh:
            model = params_safetensors.create_model_from_safe_tensors(
                directory, config, mesh=mesh, dtype=dtype
            )
    return mesh, model


def bare_lora(base: Any, lora: Any, mesh: Any) -> Any:
    import qwix
    from flax import nnx

    provider = qwix.LoraProvider(module_path=lora.module_path, rank=lora.rank, alpha=lora.alpha)
    with mesh:
        return qwix.apply_lora_to_model(
            base, provider, rngs=nnx.Rngs(params=0), **base.get_model_input()
        )


def bare_sft(recipe: Any, arrays: dict[str, np.ndarray], workdir: str, cache: str) -> None:
    import optax
    import orbax.checkpoint as ocp
    from tunix.sft import peft_trainer

    from stages.sft import model_inputs

    config = recipe.sft
    mesh, base = bare_model(recipe, cache)
    model = bare_lora(base, config.lora, mesh)
    training = peft_trainer.TrainingConfig(
        eval_every_n_steps=10**9,
        max_steps=config.max_steps,
        checkpoint_root_directory=os.path.join(workdir, "ckpt"),
        checkpointing_options=ocp.CheckpointManagerOptions(
            save_interval_steps=config.checkpoint_every_steps, max_to_keep=2
        ),
    )
    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(config.learning_rate, weight_decay=config.weight_decay),
    )
    trainer = peft_trainer.PeftTrainer(model, optimizer, training)
    trainer = trainer.with_gen_model_input_fn(model_inputs)  # the same packed-aware inputs
    with mesh:
        trainer.train(shuffled_batches(arrays, config.batch_size, config.seed))


def shuffled_batches(arrays: dict[str, np.ndarray], batch_size: int, seed: int) -> Any:
    rows = len(arrays["input_tokens"])
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(rows)
        for start in range(0, rows - batch_size + 1, batch_size):
            chosen = order[start : start + batch_size]
            yield {k: v[chosen] for k, v in arrays.items()}


ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
FORMAT = re.compile(r"^\s*<reasoning>.*?</reasoning>\s*<answer>.*?</answer>\s*$", re.S)


def match_format(prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
    return [1.0 if FORMAT.match(c) else 0.0 for c in completions]


def match_answer(
    prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_: Any
) -> list[float]:
    scores = []
    for completion, truth in zip(completions, answer, strict=True):
        found = ANSWER.search(completion)
        try:
            scores.append(float(found is not None and float(found.group(1)) == float(truth)))
        except ValueError:
            scores.append(0.0)
    return scores


def bare_grpo(
    recipe: Any, rows: list[dict[str, Any]], sft_dir: str, workdir: str, cache: str
) -> None:
    import optax
    import orbax.checkpoint as ocp
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout
    from tunix.sft import checkpoint_manager

    from stages.grpo.training import prompt_batches
    from stages.modeling import tunix_api
    from stages.modeling.tokenizers import build_tokenizer

    config, prompt_len = recipe.grpo, recipe.data.max_prompt_len
    tokenizer = build_tokenizer(recipe.model, cache)
    mesh, base = bare_model(recipe, cache)
    # The KL reference is the SFT policy, as in FAR (not the LoRA-free base): both the
    # reference and the actor are the SFT checkpoint's adapters on the base, so both sides
    # compute the same log-probabilities.
    reference, actor = (bare_lora(base, recipe.sft.lora, mesh) for _ in range(2))
    manager = checkpoint_manager.CheckpointManager(sft_dir)
    with mesh:
        for policy in (reference, actor):
            manager.maybe_restore(policy, restore_only_lora_params=True)
    manager.close()
    role = rl_cluster_lib.Role
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={role.ACTOR: mesh, role.REFERENCE: mesh, role.ROLLOUT: mesh},
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optax.adamw(config.learning_rate),
            eval_every_n_steps=10**9,
            max_steps=config.max_steps,
            mini_batch_size=config.batch_size,
            checkpoint_root_directory=os.path.join(workdir, "ckpt"),
            checkpointing_options=ocp.CheckpointManagerOptions(
                save_interval_steps=config.checkpoint_every_steps, max_to_keep=2
            ),
        ),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=config.max_generation_tokens,
            max_prompt_length=prompt_len,
            kv_cache_size=prompt_len + config.max_generation_tokens + 8,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            eos_tokens=[tokenizer.eos_id(), tokenizer.end_of_turn_id()],
        ),
    )
    cluster = tunix_api.RLEngine(
        actor=actor, reference=reference, tokenizer=tokenizer, cluster_config=cluster_config
    )
    learner = grpo_learner.GRPOLearner(
        **{tunix_api.LEARNER_ENGINE_ARG: cluster},
        algo_config=grpo_learner.GRPOConfig(
            num_generations=config.num_generations, beta=config.beta, epsilon=config.epsilon
        ),
        reward_fns=[match_format, match_answer],
    )
    with mesh:
        learner.train(prompt_batches(rows, config.batch_size, config.seed))


# --- the comparison --------------------------------------------------------------------------


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare(
    recipe: Any, reps: int, workdir: Path, cache: str, untimed: bool = False
) -> dict[str, list[float]]:
    from schemas.record import StageRecord
    from stages import sft
    from stages.core import storage
    from stages.core.datasets import load_prompts, load_sft_arrays
    from stages.core.runner import RunContext
    from stages.data_prep import build as data_prep
    from stages.grpo import timing
    from stages.grpo import training as grpo

    prepared = data_prep.prepare(recipe.data, recipe.model, RunContext(str(workdir), "data"))
    dataset = prepared.output
    arrays, rows = load_sft_arrays(dataset), load_prompts(dataset, "grpo_train")
    counter = itertools.count()
    sft_ckpt: dict[str, Any] = {}
    phases: list[dict[str, float]] = []  # FAR's GRPO: mean seconds per step of each phase

    def far_sft() -> None:
        ctx = RunContext(str(workdir), f"far{next(counter)}", cache_dir=cache)
        sft_ckpt["far"] = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output

    def far_grpo() -> None:
        ctx = RunContext(str(workdir), f"far{next(counter)}", cache_dir=cache)
        out = grpo.reinforce(dataset, sft_ckpt["far"], recipe.grpo, recipe.model, recipe.mesh, ctx)
        history = StageRecord.model_validate(storage.read_json(out.record_uri)).history
        phases.append(timing.step_seconds(history))

    def far_grpo_untimed() -> None:
        """FAR's GRPO without its per-phase timer, which waits for each phase's device work."""
        from unittest import mock

        ctx = RunContext(str(workdir), f"far{next(counter)}", cache_dir=cache)
        with mock.patch.object(timing, "instrument", lambda cluster, learner: None):
            grpo.reinforce(dataset, sft_ckpt["far"], recipe.grpo, recipe.model, recipe.mesh, ctx)

    def bare_sft_run() -> None:
        out = workdir / f"bare{next(counter)}"
        bare_sft(recipe, arrays, str(out), cache)

    def bare_grpo_run() -> None:
        # From FAR's SFT checkpoint (the same Tunix layout), not the bare script's own: the two
        # SFT runs see the data in different orders, and a different starting policy writes
        # completions of other lengths, which is other rollout work (Tunix's sampler stops when
        # every sequence has ended).
        start = storage.fetch_tree(sft_ckpt["far"].uri)
        bare_grpo(recipe, rows, start, str(workdir / f"bare{next(counter)}"), cache)

    ratios: dict[str, list[float]] = {"sft": [], "grpo": []}
    seconds: dict[str, list[float]] = {}
    for rep in range(reps + 1):  # repetition 0 warms up
        order = [("far", far_sft, far_grpo), ("bare", bare_sft_run, bare_grpo_run)]
        got: dict[str, float] = {}
        for name, run_sft, run_grpo in order[::-1] if rep % 2 else order:  # FAR first at 0
            got[f"{name}_sft"] = timed(run_sft)
            got[f"{name}_grpo"] = timed(run_grpo)
            if name == "far" and untimed:  # the same SFT checkpoint, GRPO without the timer
                got["far_untimed_grpo"] = timed(far_grpo_untimed)
        print(
            f"rep {rep}{' (warm-up)' if rep == 0 else ''}: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in got.items()),
            flush=True,
        )
        if rep == 0:
            continue
        for key, value in got.items():
            seconds.setdefault(key, []).append(value)
        ratios["sft"].append(got["far_sft"] / got["bare_sft"])
        ratios["grpo"].append(got["far_grpo"] / got["bare_grpo"])
        if untimed:
            ratios.setdefault("grpo_untimed", []).append(got["far_untimed_grpo"] / got["bare_grpo"])
    for phase in phases[0]:
        seconds[f"far_grpo_step_{phase}"] = [p[phase] for p in phases[1:]]
    return {**{f"ratio_{k}": v for k, v in ratios.items()}, **seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smoke", help="recipes/<name>.yaml (smoke, demo)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sft-steps", type=int, default=None)
    parser.add_argument("--grpo-steps", type=int, default=None)
    parser.add_argument("--cache-dir", default=os.environ.get("FAR_CACHE_DIR"))
    parser.add_argument(
        "--far-untimed",
        action="store_true",
        help="also run FAR's GRPO without its per-phase timer (what the timer's waits cost)",
    )
    args = parser.parse_args()
    from stages.core.runner import RunContext
    from tests.conftest import recipe_with

    changes: dict[str, Any] = {"sft": {}, "grpo": {}}
    if args.sft_steps:
        changes["sft"]["max_steps"] = args.sft_steps
    if args.grpo_steps:
        changes["grpo"]["max_steps"] = args.grpo_steps
    cache = RunContext(root="", run="", cache_dir=args.cache_dir).model_cache
    with tempfile.TemporaryDirectory(prefix="far-vs-tunix-") as tmp:
        recipe = recipe_with(tmp, args.recipe, **changes)
        results = compare(recipe, args.reps, Path(tmp), cache, args.far_untimed)
    print(
        f"\n{args.recipe}: SFT {recipe.sft.max_steps} steps, GRPO {recipe.grpo.max_steps} "
        f"steps, {args.reps} repetitions; load average {os.getloadavg()}"
    )
    for name, values in results.items():
        unit = "" if name.startswith("ratio") else " s"
        print(
            f"{name:<34} median {statistics.median(values):.3f}{unit}  "
            f"min {min(values):.3f}  max {max(values):.3f}"
        )


if __name__ == "__main__":
    main()
