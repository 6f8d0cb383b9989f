"""Every place FAR reads or writes Tunix internals, behind a version guard.

Tunix is young and its private attributes move between releases (its main branch already
renames RLCluster and moves checkpointing to Orbax v1). Each workaround below names the defect
it works around and has a test that shows the defect; all of them were written against the
versions in tunix_version.TESTED_TUNIX_VERSIONS. Importing this module with any other
installed google-tunix raises UntestedTunixError naming both (see tunix_version.py): an
upgrade must be a decision, re-checked against these tests, never a silent change.

Each adaptation is declared, with its upstream report and its condition for removal, in
stages/modeling/patches/ledger.py (docs/tunix-patches.md is generated from it). Two stay
installed at import because every trainer of every stage needs them (the checkpoint write
fence and the fallback to the newest intact step); everything else is per instance or per
call. FAR's own fast paths in the second half are installed only while a stage that asked
runs (stages/modeling/fast_paths.py): importing this module leaves them out of Tunix and qwix.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from orbax.checkpoint._src.path import atomicity
from orbax.checkpoint._src.path import deleter as orbax_deleter
from qwix._src.providers import lora as qwix_lora
from tunix.generate import sampler as tunix_sampler
from tunix.models.gemma3 import model as gemma3_model
from tunix.rl import common as rl_common
from tunix.rl.rollout import base_rollout, vanilla_rollout
from tunix.sft import checkpoint_manager as tunix_ckpt
from tunix.sft import peft_trainer

from stages.core import sessions, storage
from stages.core.errors import InputError
from stages.modeling import projection, sampling, tunix_api, tunix_version

tunix_version.check_installed()
log = logging.getLogger(__name__)


# --- progress bar ---------------------------------------------------------------------------


class _NoBar:
    """Stands in for Tunix's ProgressBar: what PeftTrainer calls on it does nothing."""

    def update_metrics(self, *args: Any, **kwargs: Any) -> None:
        return None

    def update(self, *args: Any, **kwargs: Any) -> None:
        return None

    def close(self) -> None:
        return None


def hide_progress_bar(trainer: peft_trainer.PeftTrainer) -> None:
    """Tunix 0.1.7's PeftTrainer (GRPO's actor trainer too) draws its own tqdm bar on a
    terminal, built in train() when `_pbar` is None; its ETA counts the compiling first step.
    Where FAR draws the stage's bar (stages/core/progress.py) that would be a second bar: a
    stand-in `_pbar` keeps Tunix's from drawing (close() sets it back to None). Test:
    tests/integration/test_tunix_progress_bar.py (Tunix's bar on a terminal without it)."""
    trainer._pbar = _NoBar()


# --- GRPO resume ----------------------------------------------------------------------------


def resync_after_restore(cluster: Any, learner: Any, step: int) -> None:
    """Work around two Tunix 0.1.7 resume defects of RLCluster.

    1. With a rollout model apart from the actor (another mesh), the rollout and anchor
       weights hold the pre-restore policy until the first sync: push the restored adapters
       now. When the two share their variables (one mesh), a sync must NOT happen: it replaces
       the sampler's variables with copies, so the rollout would sample from the restored
       policy for the rest of the session (Tunix never syncs a shared model again).
    2. The global step restarts at 0 when the last checkpoint was written by close() (empty
       custom metadata): set it to the restored step.
    Tests: tests/integration/test_grpo_full.py (the stale-rollout and shared-rollout cases,
    each checked to fail without this) and test_grpo_sessions.py (global step after close()).
    """
    if learner.should_sync_weights:
        cluster.sync_weights()  # also bumps global_steps, set just below
    cluster.global_steps = step


def skip_tunix_fast_forward(learner: Any) -> None:
    """Tunix 0.1.7's RLLearner.train() skips `actor_trainer.iter_steps` micro-batches of a
    restored run's data before training. FAR's GRPO stage already starts its prompt stream at
    the first untrained batch (Tunix's count is also wrong when num_iterations > 1: it counts
    each batch once per iteration), so Tunix's skip would drop batches a second time: the
    resumed run then trained on other prompts than an uninterrupted run (measured: adapters off
    by 2.7e-4 after 6 steps; bitwise equal with this). Test: test_grpo_full.py's kill -9
    resume ends bitwise equal to an uninterrupted run."""
    learner._last_iter_step = 0


def cluster_metrics_loggers(cluster: Any) -> list[Any]:
    """Both MetricsLoggers an RLCluster owns (Tunix 0.1.7 keeps the RL one private)."""
    return [cluster._rl_metrics_logger, cluster.actor_trainer.metrics_logger]


# --- GRPO phase timing ------------------------------------------------------------------------


def wrap_grpo_phases(cluster: Any, learner: Any, wrap: Callable[..., Callable[..., Any]]) -> None:
    """Replace, on these two instances only, the methods Tunix 0.1.7 calls for each GRPO phase
    by `wrap(phase, method[, settle])` (stages/grpo/timing.py times them).

    Tunix's own tracer (RLCluster perf_config) reports rollout, reference inference, actor
    training and weight sync, but not rewards or checkpoint saves, and its spans are private
    structures; these are the calls the learner makes through instance attribute lookups,
    so shadowing them on the instance changes nothing else. Rewards are computed in the
    learner's private `_compute_rewards`; the actor's checkpoint saves go through its
    trainer's `checkpoint_manager.save`. Within the rollout, Tunix's vanilla engine keeps its
    Sampler private (`_sampler`), and the Sampler its two compiled functions (prompt prefill,
    decode while-loop) as private instance attributes: they are timed as `rollout_prefill` and
    `rollout_decode`, nested in `rollout`. Test: tests/integration/test_grpo_timing.py trains
    two tiny GRPO steps and finds every phase's seconds in the step metrics.
    """
    actor = cluster.actor_trainer

    def settle_actor(_: Any) -> Any:
        return jax.block_until_ready(nnx.state(actor.model, nnx.Param))

    cluster.generate = wrap("rollout", cluster.generate)
    cluster.get_ref_per_token_logps = wrap("reference_logps", cluster.get_ref_per_token_logps)
    cluster.get_old_per_token_logps = wrap("old_logps", cluster.get_old_per_token_logps)
    cluster.update_actor = wrap("actor_update", cluster.update_actor, settle_actor)
    cluster.sync_weights = wrap("weight_sync", cluster.sync_weights, settle_actor)
    learner._compute_rewards = wrap("rewards", learner._compute_rewards)
    manager = actor.checkpoint_manager
    manager.save = wrap("checkpoint_save", manager.save, before=lambda: settle_actor(None))
    engine = cluster.rollout
    if isinstance(engine, vanilla_rollout.VanillaRollout):
        sampler = engine._sampler
        sampler._compiled_prefill_fn = wrap("rollout_prefill", sampler._compiled_prefill_fn)
        sampler._compiled_decode_fn = wrap("rollout_decode", sampler._compiled_decode_fn)


# --- jax.monitoring listeners ----------------------------------------------------------------


def unregister_duration_listener(listener: Callable[..., None]) -> None:
    """Remove a jax.monitoring duration listener that Tunix may already have removed.

    Tunix's MetricsLogger.close() (end of PeftTrainer.train) clears every JAX duration
    listener, ours included; JAX 0.10.2 then raises AssertionError on unregistering it. By
    then training, and so the listening, is over."""
    try:
        jax.monitoring.unregister_event_duration_listener(listener)
    except AssertionError:
        return


def unregister_event_listener(listener: Callable[..., None]) -> None:
    """Remove a jax.monitoring event listener that Tunix may already have removed (the same
    MetricsLogger.close() clears event listeners too; see unregister_duration_listener)."""
    try:
        jax.monitoring.unregister_event_listener(listener)
    except AssertionError:
        return


def release_scalar_listeners(metrics_logger: Any) -> int:
    """Detach a closed Tunix MetricsLogger's backends from jax.monitoring; how many were left.

    Tunix registers each backend's log_scalar as a JAX scalar listener and, on close, relies on
    jax.monitoring.clear_event_listeners(), which in JAX 0.10.2 does not clear scalar
    listeners (it assigns a local `_scalar_listeners`). The closed TensorBoard backend then
    reopens a file in the finished stage's directory and receives every later stage's
    scalars. Call this after training so a committed stage directory stays as recorded.
    Test: tests/unit/test_tunix_compat.py shows the leak and its release.
    """
    released = 0
    for backend in getattr(metrics_logger, "_backends", []):
        try:
            jax.monitoring.unregister_scalar_listener(backend.log_scalar)
        except AssertionError:  # not registered (process index > 0, or already released)
            continue
        released += 1
    return released


TESTED_ORBAX_VERSIONS = ("0.12.8",)


def raise_save_errors(trainer: Any) -> None:
    """Raise the error of a failed asynchronous checkpoint save of a Tunix trainer, if any.

    Tunix's CheckpointManager keeps Orbax's manager in the private `_checkpoint_manager`
    (None without a checkpoint directory). Orbax's save finishes in its background
    `_finalize_thread`, which keeps what it hit (a full disk) as its `exception` and raises it
    only when joined, at the next save, many steps later; its public `check_for_errors`
    misses it once that thread consumed the checkpointer's error. The thread is read only on
    the tested Orbax versions. Test: tests/unit/test_full_disk.py.
    """
    manager = getattr(trainer.checkpoint_manager, "_checkpoint_manager", None)
    if manager is None:
        return
    manager.check_for_errors()
    if metadata.version("orbax-checkpoint") not in TESTED_ORBAX_VERSIONS:
        return
    error = manager._finalize_thread.map(
        lambda thread: None if thread is None or thread.is_alive() else thread.exception
    )
    if error is not None:
        raise error


# --- the write fence of checkpoint saves ------------------------------------------------------


def fence_checkpoint_writes() -> None:
    """Make every checkpoint write of every Tunix trainer ask the stage's write fence first
    (stages/core/sessions.check_writes: the session still holds the run's lease, and nobody
    else committed the stage directory), once per process.

    The five training stages save through Tunix's CheckpointManager.save (PeftTrainer's loop
    and its close(); GRPO's actor trainer), which starts an Orbax save that a background
    thread commits later: by renaming its temporary directory (AtomicRenameTemporaryPath,
    local), or writing its commit file (CommitFileTemporaryPath, gs://), then deleting the
    steps beyond max_to_keep (StandardCheckpointDeleter). A holder stopped past its lease
    (SIGSTOP, a frozen VM) and continued would otherwise write, commit or delete a step in a
    directory its successor committed before its heartbeat stops it. Each of the four is
    fenced on the class, so no trainer construction changes; outside a stage's work the fence
    is a no-op. Test: tests/unit/test_checkpoint_fence.py."""
    if getattr(tunix_ckpt.CheckpointManager.save, "_far_fenced", False):
        return
    tunix_ckpt.CheckpointManager.save = _fenced(tunix_ckpt.CheckpointManager.save)
    for kind in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
        kind.finalize = _fenced_async(kind.finalize)
    orbax_deleter.StandardCheckpointDeleter.delete = _fenced(
        orbax_deleter.StandardCheckpointDeleter.delete
    )


def _fenced(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def fenced(*args: Any, **kwargs: Any) -> Any:
        sessions.check_writes()
        return method(*args, **kwargs)

    fenced._far_fenced = True  # type: ignore[attr-defined]
    return fenced


def _fenced_async(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def fenced(*args: Any, **kwargs: Any) -> Any:
        sessions.check_writes()
        return await method(*args, **kwargs)

    return fenced


fence_checkpoint_writes()


# --- a damaged latest checkpoint --------------------------------------------------------------


DAMAGED_SUFFIX = ".damaged"  # <root>.damaged/<step>: a step that could not be restored


def restore_newest_intact() -> None:
    """Make Tunix's CheckpointManager.maybe_restore (every trainer's resume) fall back to the
    newest step that restores when the latest one does not (a file deleted or torn), once
    per process.

    Tunix 0.1.7 restores the latest step and lets Orbax's error out as a traceback. Here a
    step that fails is moved aside to `<root>.damaged/<step>` (kept for inspection; Orbax
    would refuse to save that step again), said in one log line, and the next older step is
    tried; with none left, DamagedCheckpoint names the step and Orbax's first line (the
    file). Nothing is updated before a restore succeeds, so a failed one leaves the model as
    it was. Orbax's failed read leaves TensorStore reads under way whose callbacks meet its
    closed event loop, and read coroutines that raise when they are collected, whenever
    TensorStore's threads let go of them (before the failed read raises, or after the
    restore returns, in some runs); Python would print each as a traceback around FAR's line:
    from the first restore on, they go to the log at DEBUG instead (`quiet_failed_reads`).
    Test: tests/integration/test_sft_full.py (a deleted checkpoint file),
    tests/unit/test_checkpoint_fence.py (the quiet console)."""
    original = tunix_ckpt.CheckpointManager.maybe_restore
    if getattr(original, "_far_fallback", False):
        return

    @functools.wraps(original)
    def maybe_restore(self: Any, *args: Any, **kwargs: Any) -> Any:
        manager = self._checkpoint_manager
        if manager is None or args[2:] or kwargs.get("step") is not None:
            return original(self, *args, **kwargs)
        quiet_failed_reads()  # before the read: its leftovers may come before it raises
        while True:
            step = manager.latest_step()
            try:
                return original(self, *args, **kwargs)
            except Exception as e:  # a stop, a lost lease or a network fault is no damage
                if (
                    step is None
                    or isinstance(e, sessions.LeaseLost | sessions.SaveFailed)
                    or storage.is_transient(e)
                ):
                    raise
                _set_aside(manager, step, e)

    maybe_restore._far_fallback = True  # type: ignore[attr-defined]
    tunix_ckpt.CheckpointManager.maybe_restore = maybe_restore


_FAILED_READ_NOISE = ("Event loop is closed", "Encountered error while reading array")


def quiet_failed_reads() -> None:
    """From now on in this process, an unraisable exception left by a failed Orbax read (a
    TensorStore callback meeting the closed event loop, or a read coroutine's own error when
    it is collected) is logged at DEBUG with its traceback, not printed; any other goes to the
    hook before. Installed once, before the first restore: the leftovers come from other
    threads at any time, even before the failed read raises. A read that succeeds leaves none."""
    previous = sys.unraisablehook
    if getattr(previous, "_far_failed_reads", False):
        return

    def hook(unraisable: Any) -> None:
        if not str(unraisable.exc_value).startswith(_FAILED_READ_NOISE):
            previous(unraisable)
            return
        info = (unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback)
        log.debug("a failed checkpoint read left: %s", unraisable.exc_value, exc_info=info)

    hook._far_failed_reads = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


class DamagedCheckpoint(InputError):
    """No saved step of a stage's checkpoints can be restored."""


def _set_aside(manager: Any, step: int, error: Exception) -> None:
    root = manager.directory
    cause = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    earlier = [s for s in manager.all_steps() if s < step]
    if not earlier:
        raise DamagedCheckpoint(
            f"checkpoint step {step} in {root} cannot be restored ({cause}) and there is no "
            f"earlier step: restore its files, or delete {root / str(step)} to train the "
            f"stage from its start"
        ) from error
    sessions.check_writes()  # moving the step aside writes the stage directory
    aside = root.parent / f"{root.name}{DAMAGED_SUFFIX}"
    aside.mkdir(parents=True, exist_ok=True)
    (root / str(step)).rename(aside / str(step))
    manager.reload()
    previous = max(earlier)
    log.warning(
        "checkpoint step %d in %s cannot be restored (%s): moved to %s; resuming from step %d",
        step,
        root,
        cause,
        aside / str(step),
        previous,
    )


restore_newest_intact()


# --- rollout seeds ---------------------------------------------------------------------------


class SeededRollout(vanilla_rollout.VanillaRollout):
    """Tunix's vanilla rollout engine, sampling each generate call with its own seed.

    Tunix 0.1.7 passes RolloutConfig.seed unchanged to every generate call, so every GRPO step
    samples with the same PRNG key (and seed None means PRNGKey(0) every time). Here each call
    asks `seed_of(global_step, call_index)`; `follow(step_of)` binds the cluster's step
    counter. RLCluster builds the engine by calling it positionally as
    (rollout_actor, tokenizer, mesh, rollout_config), which is why the signature is fixed.
    A greedy call (top_p None: Tunix's sampler then takes the argmax, the greedy baseline's
    EVAL config) draws nothing, so it takes no seed: the sampled calls keep their seeds and
    `seeds_used` stays one entry per sampled call. A sampled call draws its tokens by `draw`
    (`set_draw` on the engine's sampler: Tunix's Gumbel-max, or the inverse CDF).
    `prompt_group` > 1 (grpo.share_prompts: num_generations): a call whose prompts come in
    runs of that many equal prompts runs its prefill on one prompt of each run
    (_prefill_sharing_prompts); any other call, Tunix's prefill. `projection` "bfloat16"
    (grpo.sampler_projection) gives the sampler a bfloat16 vocabulary table
    (attach_vocab_table; the actor's log-probs keep the float32 one).
    Test: tests/unit/test_grpo_parts.py and the GRPO samples' seeds after a resume.
    """

    def __init__(
        self,
        rollout_actor: Any,
        tokenizer: Any,
        mesh: Any,
        rollout_config: base_rollout.RolloutConfig,
        *,
        seed_of: Callable[[int, int], int],
        draw: str = "gumbel",
        prompt_group: int = 1,
        projection: str = "float32",
    ) -> None:
        config = rollout_actor.config
        attach_vocab_table(rollout_actor, projection)  # before the sampler splits the model
        cache = base_rollout.CacheConfig(
            cache_size=rollout_config.kv_cache_size,
            num_layers=config.num_layers,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
        )
        super().__init__(rollout_actor, tokenizer, cache_config_or_size=cache)
        self.seed_of = seed_of
        set_draw(self._sampler, draw)  # how a sampled call draws its tokens
        self.prompt_group = prompt_group
        self._share_prompts = False  # this call's prompts come in runs of prompt_group
        if prompt_group > 1:
            self._sampler._compiled_prefill_fn = self._prefill_choosing(
                self._sampler._compiled_prefill_fn,
                jax.jit(
                    functools.partial(_prefill_sharing_prompts, self._sampler, prompt_group),
                    donate_argnums=(1,),  # as Tunix's: the state's buffers are reused
                    static_argnames=("echo",),
                ),
            )
        self.seeds_used: list[tuple[int, int]] = []  # (global step, seed) per generate call
        self._step_of: Callable[[], int] | None = None

    def _prefill_choosing(
        self, tunix_prefill: Callable[..., Any], shared_prefill: Callable[..., Any]
    ) -> Callable[..., Any]:
        """The sampler's one compiled prefill (what Sampler.__call__ calls, and the phase
        timer wraps): the shared one for a call whose prompts come in runs, else Tunix's."""

        def prefill(*args: Any, **kwargs: Any) -> Any:
            return (shared_prefill if self._share_prompts else tunix_prefill)(*args, **kwargs)

        return prefill

    def follow(self, step_of: Callable[[], int]) -> None:
        """Read the global step from `step_of` (the cluster's counter) at each generate call."""
        self._step_of = step_of

    def next_seed(self) -> int:
        if self._step_of is None:
            raise RuntimeError("SeededRollout.follow(step_of) was not called before generating")
        step = self._step_of()
        call = sum(1 for s, _ in self.seeds_used if s == step)
        seed = self.seed_of(step, call)
        self.seeds_used.append((step, seed))
        return seed

    def generate(
        self, prompts: list[str], rollout_config: base_rollout.RolloutConfig, **kwargs: Any
    ) -> base_rollout.RolloutOutput:
        self._share_prompts = prompt_runs(list(prompts), self.prompt_group)
        if rollout_config.top_p is None:  # greedy: Sampler.init_sample_state picks argmax
            return super().generate(prompts, rollout_config, **kwargs)
        seeded = dataclasses.replace(rollout_config, seed=jax.random.PRNGKey(self.next_seed()))
        return super().generate(prompts, seeded, **kwargs)


# --- Gemma 3 attention -----------------------------------------------------------------------


def gemma3_qk_norm_scales(attention: Any) -> tuple[Any, Any]:
    """The query and key RMSNorm scale parameters of a Tunix Gemma 3 attention block.

    Tunix 0.1.7 keeps them as private attributes with no public accessor; the export test
    (tests/integration/test_real_model.py) checks the exported logits against transformers."""
    return attention._query_norm.scale, attention._key_norm.scale


# --- log-probabilities of the completion only --------------------------------------------------

# Tunix 0.1.7's own function, kept for the models the replacement does not handle and for the
# test that shows its cost (tests/unit/test_completion_logits.py).
TUNIX_COMPUTE_PER_TOKEN_LOGPS = rl_common.compute_per_token_logps


@functools.partial(
    jax.jit,
    static_argnames=("pad_id", "eos_id", "stop_gradient", "return_logits", "temperature"),
)
def completion_per_token_logps(
    graphdef: Any,
    state: Any,
    prompt_tokens: jax.Array,
    completion_tokens: jax.Array,
    pad_id: int,
    eos_id: int,
    images: jax.Array | None = None,
    stop_gradient: bool = True,
    return_logits: bool = False,
    segment_ids: jax.Array | None = None,
    segment_positions: jax.Array | None = None,
    temperature: float = 1.0,
) -> Any:
    """tunix.rl.common.compute_per_token_logps with the output projection applied to the
    completion positions only.

    Tunix 0.1.7 decodes every position of prompt + completion to full-vocabulary logits and
    then slices the completion's (XLA does not move the slice before the matmul): with Gemma
    3's 262,144-token vocabulary the projection is about 0.34 of the 0.54 GFLOP a token costs,
    and for a 64-token prompt before 32 completion tokens two thirds of it is thrown away, in
    the actor update (forward and backward) and the reference and old-policy log-probs. Here
    the model runs to its final norm (`output_hidden_states`, a public argument); its own
    full logits are then unused and compiled away, and only the hidden states that predict
    completion tokens are projected, through `projection.token_logps` (vocabulary-major
    logits and a written-out backward: faster on XLA CPU, measured in bench/roofline.py).
    Log-probs and gradients equal Tunix's to float rounding (the order of sums differs;
    test). Where logits are asked for (`return_logits`: Tunix's losses, only for their
    entropy) a TokenEntropy stands in their place, from the same projection; with the fast
    path "completion_logps" (stages/modeling/fast_paths.py), Tunix's entropy function takes
    it and the entropy equals Tunix's to rounding (test). Packed sequences, images and other
    model families go to Tunix's function unchanged, with real logits.

    Fewer prompt rows than completion rows (share_group_prompts: each group's prompt once)
    run each prompt through the model once (_hidden_sharing_prompts); where that path does
    not apply, the prompts are repeated back and the full pass runs.
    """
    model = nnx.merge(graphdef, state)
    group = prompt_group(prompt_tokens, completion_tokens)
    sharing = group > 1 and _shares_prompts(model, prompt_tokens, completion_tokens, images)
    if group > 1 and not sharing:  # shared prompts (share_group_prompts) the full pass runs
        prompt_tokens = jnp.repeat(prompt_tokens, group, axis=0)
    if segment_ids is not None or images is not None or not isinstance(model, gemma3_model.Gemma3):
        return TUNIX_COMPUTE_PER_TOKEN_LOGPS(
            graphdef,
            state,
            prompt_tokens,
            completion_tokens,
            pad_id=pad_id,
            eos_id=eos_id,
            images=images,
            stop_gradient=stop_gradient,
            return_logits=return_logits,
            segment_ids=segment_ids,
            segment_positions=segment_positions,
            temperature=temperature,
        )
    if sharing:
        predicting = _hidden_sharing_prompts(
            model, prompt_tokens, completion_tokens, pad_id, eos_id
        )
    else:
        tokens, positions, mask, _ = rl_common.process_ids(
            prompt_tokens, completion_tokens, pad_id, eos_id
        )
        model(
            tokens, positions=positions, cache=None, attention_mask=mask, output_hidden_states=True
        )
        predicting = _final_hidden(model)[:, -completion_tokens.shape[1] - 1 : -1]
    embedding, targets = model.embedder.input_embedding.value, completion_tokens
    if not return_logits:
        per_token_logps = projection.token_logps(predicting, embedding, targets, temperature)
        return jax.lax.stop_gradient(per_token_logps) if stop_gradient else per_token_logps
    # Tunix 0.1.7's GRPO loss asks for the logits only to report their entropy
    # (algo_core.compute_entropy_from_logits): the entropy comes from the same projection, and
    # stands where the logits would (TokenEntropy, read by _entropy_from_logits).
    per_token_logps, entropy = projection.token_logps_entropy(
        predicting, embedding, targets, temperature
    )
    if stop_gradient:
        per_token_logps, entropy = jax.lax.stop_gradient((per_token_logps, entropy))
    return per_token_logps, TokenEntropy(entropy)


def _final_hidden(model: Any) -> jax.Array:
    """The hidden states after the final norm that the model's last call sowed (its
    `output_hidden_states`), taken out of the model."""
    return jax.tree.leaves(nnx.pop(model, nnx.Intermediate))[-1]


# --- the actor update's prompts: each group's prompt through the model once -----------------


def share_group_prompts(example: rl_common.TrainExample, group: int) -> rl_common.TrainExample:
    """`example` with each group's prompt once: prompt_ids and prompt_mask keep every
    `group`-th row when the rows come in runs of `group` equal prompts, as Tunix's GRPO
    learner repeats each prompt num_generations times. completion_per_token_logps reads the
    group size from the rows (completion rows / prompt rows). An example whose rows do not
    come in such runs, or a packed one, is returned unchanged (the full pass)."""
    if group < 2 or getattr(example, "segment_ids", None) is not None:
        return example
    ids = np.asarray(example.prompt_ids)
    if ids.shape[0] % group:
        return example
    runs = ids.reshape(ids.shape[0] // group, group, ids.shape[1])
    if not (runs == runs[:, :1]).all():
        return example
    return example.replace(
        prompt_ids=example.prompt_ids[::group], prompt_mask=example.prompt_mask[::group]
    )


def prompt_group(prompt_tokens: jax.Array, completion_tokens: jax.Array) -> int:
    """How many completion rows share each prompt row: 1, or share_group_prompts' group."""
    prompts, rows = prompt_tokens.shape[0], completion_tokens.shape[0]
    if prompts == 0 or rows % prompts:
        raise ValueError(
            f"{prompts} prompt rows for {rows} completion rows: expected a prompt row per "
            f"completion row or one per group of equal rows (share_group_prompts)"
        )
    return rows // prompts


def _shares_prompts(
    model: Any, prompt_tokens: jax.Array, completion_tokens: jax.Array, images: Any
) -> bool:
    """Whether _hidden_sharing_prompts serves this call: Gemma 3, no images, and every
    sliding-window layer's window covers the whole sequence (Tunix's multi-position mask for
    those layers assumes the queries start at key 0, which the completion pass does not).
    Packed examples never get here with fewer prompt rows (share_group_prompts keeps them)."""
    if images is not None or not isinstance(model, gemma3_model.Gemma3):
        return False
    length = prompt_tokens.shape[1] + completion_tokens.shape[1]
    return all(
        layer.attn.attn_type != gemma3_model.AttentionType.LOCAL_SLIDING
        or layer.attn.sliding_window_size >= length
        for layer in model.layers
    )


def _empty_cache(model: Any, rows: int, length: int) -> dict[str, Any]:
    """A zero key/value cache of `length` positions for `rows` rows: Tunix's Sampler's own
    (`_init_cache`), in the model's parameter dtype."""
    config = model.config
    dtype = model.embedder.input_embedding.value.dtype
    return tunix_sampler._init_cache(
        config.num_layers, length, rows, config.num_kv_heads, config.head_dim, dtype
    )


def _hidden_sharing_prompts(
    model: Any, prompt_tokens: jax.Array, completion_tokens: jax.Array, pad_id: int, eos_id: int
) -> jax.Array:
    """[rows, completion, features]: the final hidden states that predict each completion
    token, with each group's prompt run through the model once.

    Tunix's GRPO learner repeats every prompt num_generations times, and its actor update
    runs each copy through every layer, forward and backward: on reinforce-headroom 8 x 41
    prompt tokens of each 73-token group. Here the group's prompt runs once, into a key/value
    cache of the whole sequence's length, which is then repeated for the group's rows; the
    completions run on it (Tunix's own cached attention, with the full sequence's positions
    and mask rows). The adapters' gradient through the prompt is the sum over the group, as
    autodiff of the repeat gives. The same tokens at the same positions as the full pass:
    log-probs and gradients equal to float rounding (test)."""
    group = prompt_group(prompt_tokens, completion_tokens)
    width = prompt_tokens.shape[1]
    tokens, positions, mask, _ = rl_common.process_ids(
        jnp.repeat(prompt_tokens, group, axis=0), completion_tokens, pad_id, eos_id
    )
    _, cache = model(
        prompt_tokens,
        positions=positions[::group, :width],
        cache=_empty_cache(model, prompt_tokens.shape[0], tokens.shape[1]),
        attention_mask=mask[::group, :width],
        output_hidden_states=True,
    )
    last_prompt = jnp.repeat(_final_hidden(model)[:, -1:], group, axis=0)
    model(
        completion_tokens,
        positions=positions[:, width:],
        cache=jax.tree.map(lambda array: jnp.repeat(array, group, axis=0), cache),
        attention_mask=mask[:, width:],
        output_hidden_states=True,
    )
    return jnp.concatenate([last_prompt, _final_hidden(model)[:, :-1]], axis=1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenEntropy:
    """What completion_per_token_logps returns where Tunix asks for logits: the entropy of
    each completion position's (temperature-scaled) distribution, [batch, completion].

    Tunix 0.1.7 reads those logits in one place, `algo_core.compute_entropy_from_logits`
    (GRPO's `entropy` metric, PPO's entropy term), which decodes the completion to
    full-vocabulary logits a second time, positions-major, and runs log-softmax then softmax
    over them: on reinforce-headroom's actor update (32 rows, 32 completion positions) that
    was 6.5 of 18.7 s of the compiled step's thread time (docs/log.md, 2026-11-27). Anything
    else that reads this as an array fails loudly (no shape, no arithmetic)."""

    entropy: jax.Array


TUNIX_ENTROPY_FROM_LOGITS = tunix_api.ENTROPY_MODULE.compute_entropy_from_logits


def _entropy_from_logits(logits: Any) -> jax.Array:
    """algo_core.compute_entropy_from_logits that takes a TokenEntropy as it comes."""
    if isinstance(logits, TokenEntropy):
        return logits.entropy
    return TUNIX_ENTROPY_FROM_LOGITS(logits)


# --- the rollout's prompt pass: logits of the last prompt position only -------------------------

# Tunix 0.1.7's Gemma 3 call, kept for every call that does not ask for the last position only.
TUNIX_GEMMA3_CALL = gemma3_model.Gemma3.__call__


def _gemma3_call(
    self: Any,
    last_tokens: jax.Array,
    positions: jax.Array | None = None,
    cache: Any = None,
    attention_mask: jax.Array | None = None,
    output_hidden_states: bool = False,
    *,
    images: jax.Array | None = None,
    decode_only_last_token: bool = False,
) -> tuple[jax.Array, Any]:
    """Gemma3.__call__ that, asked for `decode_only_last_token`, projects only the last
    position to the vocabulary; otherwise Tunix's own call, unchanged (fast path
    "prefill_last_position", stages/modeling/fast_paths.py).

    Tunix 0.1.7's Sampler passes `decode_only_last_token=True` to the model's prefill call
    when the model's __call__ accepts that argument (it checks the signature when the Sampler
    is built), and then reads only the last position's logits (`_sample`: logits[:, -1]);
    its Gemma 3 does not accept it, so every prompt position is projected to the vocabulary
    and all but one thrown away. The last position's logits are the same arithmetic, bit for
    bit. Samplers (and qwix LoRA clones, which bind __call__ when cloned) made outside the
    fast path keep Tunix's prefill.
    Test: tests/unit/test_prefill_last_position.py shows Tunix's prefill projecting every
    position (compiled FLOPs) and the sampled completions equal with this."""
    if not decode_only_last_token or output_hidden_states:
        return TUNIX_GEMMA3_CALL(
            self, last_tokens, positions, cache, attention_mask, output_hidden_states, images=images
        )
    _, new_cache = TUNIX_GEMMA3_CALL(
        self, last_tokens, positions, cache, attention_mask, True, images=images
    )
    return self.embedder.decode(_final_hidden(self)[:, -1:]), new_cache


# --- the rollout's prompt pass: each group's prompt once ------------------------------------

TUNIX_PREFILL = tunix_sampler.Sampler._prefill_fn
_ROW_FIELDS = ("token_buffer", "positions", "done", "logits_buffer", "logprobs_buffer")


class _EveryRow:
    """Stands for a Sampler inside Tunix's prefill run on every `group`-th row: everything is
    the sampler's, except that the first token is drawn for every row (`_sample`), from the
    state, logits and cache repeated `group` times."""

    def __init__(self, sampler: tunix_sampler.Sampler, group: int) -> None:
        self._sampler, self._group = sampler, group

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)

    def _sample(self, logits: Any, cache: Any, eos: Any, sampler_state: Any) -> Any:
        def repeat(tree: Any) -> Any:
            return jax.tree.map(lambda array: jnp.repeat(array, self._group, axis=0), tree)

        rows = {name: repeat(getattr(sampler_state, name)) for name in _ROW_FIELDS}
        state = dataclasses.replace(sampler_state, cache=repeat(cache), **rows)
        return type(self._sampler)._sample(
            self._sampler, logits=repeat(logits), cache=state.cache, eos=eos, sampler_state=state
        )


def _prefill_sharing_prompts(
    sampler: tunix_sampler.Sampler,
    group: int,
    params: Any,
    sampler_state: Any,
    images: Any = None,
    echo: bool = True,
) -> Any:
    """Tunix's Sampler prefill with each group's prompt run through the model once: Tunix's
    own prefill on every `group`-th row of the state, then the first token drawn for every
    row (_EveryRow). For a call whose rows come in runs of `group` equal prompts (the caller
    checks: SeededRollout.generate); echo, images and beam search take Tunix's."""
    if echo or images is not None or sampler_state.sampling_mode == "beam_search":
        return TUNIX_PREFILL(sampler, params, sampler_state, images, echo)

    def every(tree: Any) -> Any:
        return jax.tree.map(lambda array: array[::group], tree)

    rows = {name: every(getattr(sampler_state, name)) for name in _ROW_FIELDS}
    reduced = dataclasses.replace(sampler_state, cache=every(sampler_state.cache), **rows)
    return TUNIX_PREFILL(_EveryRow(sampler, group), params, reduced, images, echo)


def prompt_runs(prompts: list[str], group: int) -> bool:
    """Whether `prompts` come in runs of `group` equal prompts (as Tunix's GRPO learner
    repeats each prompt num_generations times)."""
    if group < 2 or not prompts or len(prompts) % group:
        return False
    return all(prompts[i] == prompts[i - i % group] for i in range(len(prompts)))


# --- sampling: one uniform number per row ---------------------------------------------------

_TUNIX_SAMPLE_TOP_P = tunix_sampler.sample_top_p


def _sample_top_p(
    logits: jax.Array,
    key: jax.Array,
    temperature: float,
    top_p: float,
    top_k: int | None,
    return_logprobs: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """Tunix 0.1.7's `sample_top_p` with its no-filter path drawing by inverse CDF."""
    if top_p < 1.0 or (top_k is not None and top_k > 0):  # static: the sampler's settings
        return _TUNIX_SAMPLE_TOP_P(logits, key, temperature, top_p, top_k, return_logprobs)
    next_token_logits = logits[:, -1].astype(jnp.float32) / temperature
    next_token = sampling.inverse_cdf_categorical(key, next_token_logits)
    if not return_logprobs:
        return next_token, None
    logp = jax.nn.log_softmax(next_token_logits, axis=-1)
    return next_token, jnp.take_along_axis(logp, next_token[:, None], axis=-1)[:, 0]


DRAWS: dict[str, Callable[..., Any]] = {"gumbel": _TUNIX_SAMPLE_TOP_P, "inverse_cdf": _sample_top_p}
TUNIX_SAMPLER_SAMPLE = tunix_sampler.Sampler._sample
_DRAW = "_far_draw"  # a Sampler's own draw, set by set_draw
_TRACED = "_far_traced_draws"  # the draws its sampled decode step has been compiled with


def _sample_by_draw(
    self: tunix_sampler.Sampler,
    logits: jax.Array,
    eos: jax.Array,
    cache: Any,
    sampler_state: Any,
) -> Any:
    """Tunix 0.1.7's Sampler._sample, its sampled path drawing by this sampler's own draw.

    Tunix's `_sample` calls its module's `sample_top_p` by name while the decode step traces,
    so the function is swapped for exactly that trace (XLA keeps what was traced)."""
    draw = getattr(self, _DRAW, "gumbel")
    if sampler_state.sampling_mode == "top_p":  # static: greedy steps draw nothing
        self.__dict__.setdefault(_TRACED, set()).add(draw)
    previous = tunix_sampler.sample_top_p
    tunix_sampler.sample_top_p = DRAWS[draw]
    try:
        return TUNIX_SAMPLER_SAMPLE(self, logits, eos, cache, sampler_state)
    finally:
        tunix_sampler.sample_top_p = previous


def set_draw(sampler: tunix_sampler.Sampler, draw: str) -> None:
    """Fix how `sampler` draws a sampled token: "gumbel" (Tunix's own) or "inverse_cdf" (one
    uniform number per row).

    Tunix 0.1.7's `sample_top_p`, at top_p 1 and no top_k (unfiltered sampling), calls
    `jax.random.categorical`: Gumbel-max, one random number per vocabulary entry and row,
    which at Gemma 3's vocabulary costs more than the decode step's weight products
    (stages/modeling/sampling.py has the numbers). "inverse_cdf" replaces that path with
    `sampling.inverse_cdf_categorical`: the same distribution, other tokens for a given seed.

    The draw belongs to the sampler (an attribute its patched `_sample` reads when the decode
    step traces), so no enclosing block can change it. A compiled decode step keeps the draw
    it was traced with, so a sampler that has sampled with one draw refuses another: build a
    new sampler. The class patch is the fast path "draw" (stages/modeling/fast_paths.py): a
    draw other than "gumbel" outside it is refused; a sampler that sampled outside it drew
    with Tunix's function.
    Test: tests/unit/test_sampling.py shows Tunix's path drawing rows x vocabulary random
    numbers and this one rows, and a sampler keeping its draw inside another's block.
    """
    if draw not in DRAWS:
        raise ValueError(f"draw {draw!r}: expected one of {sorted(DRAWS)}")
    if draw != "gumbel" and tunix_sampler.Sampler._sample is not _sample_by_draw:
        raise RuntimeError(
            f"draw {draw!r} needs FAR's sampler path: run inside "
            f"fast_paths.installed('draw') (the stage's scope)"
        )
    compiled: set[str] = getattr(sampler, _TRACED, set()) - {draw}
    if compiled:
        raise ValueError(
            f"this sampler has sampled drawing by {sorted(compiled)}: its compiled decode step "
            f"keeps that draw; build another sampler to draw by {draw!r}"
        )
    setattr(sampler, _DRAW, draw)


# --- the sampler's output projection in bfloat16 ----------------------------------------------

TUNIX_EMBEDDER_DECODE = gemma3_model.Embedder.decode
PROJECTIONS = {"float32": None, "bfloat16": jnp.bfloat16}


class VocabTable(nnx.Variable):
    """A copy of the tied embedding, [embed, vocabulary] in bfloat16, that the embedder's
    `decode` reads instead of the float32 table (attach_vocab_table). Not an nnx.Param: no
    optimizer, checkpoint or export sees it."""


def _embedder_decode(self: Any, x: jax.Array) -> jax.Array:
    """Embedder.decode through the module's VocabTable where it has one (bfloat16 operands,
    float32 sums and logits); Tunix's own float32 product otherwise."""
    table = getattr(self, "vocab_table", None)
    if table is None:
        return TUNIX_EMBEDDER_DECODE(self, x)
    with jax.named_scope("embedder_decode"):
        return jnp.dot(x.astype(table.value.dtype), table.value, preferred_element_type=jnp.float32)


def attach_vocab_table(model: Any, projection: str) -> None:
    """Give `model`'s Gemma 3 embedder a bfloat16 copy of its vocabulary table for `decode`,
    which only the sampler calls in FAR (the log-probs and losses project through
    `projection`, reading the float32 table): grpo.sampler_projection.

    At 32 rows a decode step's vocabulary projection streams the 671 MB float32 table; with
    bfloat16 operands, stored [embed, vocabulary] (the layout whose bf16 product XLA CPU runs
    fast here; a [vocabulary, embed] table read transposed ran several times slower), about
    half the time (docs/performance.md). Other logits, so other sampled tokens: a recipe choice. The
    copy is made once, so the table must not train: a model with adapters on its embedder,
    or with no adapters at all (full-weight training), is refused. "float32" does nothing.
    Test: tests/unit/test_vocab_table.py.
    """
    if projection not in PROJECTIONS:
        raise ValueError(f"projection {projection!r}: expected one of {sorted(PROJECTIONS)}")
    dtype = PROJECTIONS[projection]
    if dtype is None:
        return
    if not isinstance(model, gemma3_model.Gemma3):
        raise ValueError(
            f"a bfloat16 sampler projection is Gemma 3's; this model is {type(model).__name__}"
        )
    if not jax.tree.leaves(nnx.state(model, nnx.LoRAParam)) or jax.tree.leaves(
        nnx.state(model.embedder, nnx.LoRAParam)
    ):
        raise ValueError(
            "a bfloat16 sampler projection copies the embedding once, so it needs a LoRA "
            "policy whose embedder has no adapters (full-weight training changes the "
            "embedding every step)"
        )
    if gemma3_model.Embedder.decode is not _embedder_decode:
        raise RuntimeError(
            "a bfloat16 sampler projection needs FAR's embedder decode: run inside "
            "fast_paths.installed('vocab_table') (the stage's scope)"
        )
    table = jax.jit(lambda e: e.T.astype(dtype))(model.embedder.input_embedding.value)
    first = _first_variable_dtype(model)
    model.embedder.vocab_table = VocabTable(table)
    # Tunix 0.1.7's Sampler takes its KV cache's dtype from the model's first variable
    # (`Sampler.dtype`); the attribute's name sorts after input_embedding so that stays
    if _first_variable_dtype(model) != first:
        del model.embedder.vocab_table
        raise RuntimeError("the bfloat16 table would set the sampler's KV cache dtype")


def _first_variable_dtype(model: Any) -> Any:
    return jax.tree.leaves(nnx.variables(model))[0].dtype


# --- GRPO's training examples: padding no row uses cut off -------------------------------------


def padded_width(used: int, multiple: int, cap: int) -> int:
    """`used` columns rounded up to a multiple of `multiple`, at most `cap` and at least 1
    column (a batch of empty completions keeps one): few compiled shapes, little padding."""
    return min(cap, max(1, -(-used // multiple) * multiple))


def trim_train_example(
    example: rl_common.TrainExample, multiple: int, completions: bool = True
) -> rl_common.TrainExample:
    """`example` without the columns no row uses: the prompts' leftmost (Tunix left-pads them
    to max_prompt_len) and, with `completions`, the completions' rightmost (padded to
    max_generation_tokens), each side kept to its longest row rounded up to `multiple`.

    A cut column is padding in every row (its mask is 0 everywhere), and Tunix derives
    positions and the attention mask from the masks, so every kept position sees the same
    tokens at the same positions: the log-probs, loss and gradients equal the uncut ones to
    float rounding (the attention's sums over keys are shorter; test). The per-token
    reference and old-policy log-probs lose the same completion columns. `completions`
    False keeps the completion's width, for a loss normalised by it (Dr. GRPO's
    `sequence-mean-token-scale` divides by the completion columns). Packed examples
    (segment ids) are returned unchanged.
    """
    if getattr(example, "segment_ids", None) is not None:
        return example
    prompt_used = np.asarray(np.asarray(example.prompt_mask).any(axis=0))
    prompt_cap = prompt_used.shape[0]
    first = int(np.argmax(prompt_used)) if prompt_used.any() else prompt_cap
    prompt_keep = padded_width(prompt_cap - first, multiple, prompt_cap)
    fields: dict[str, Any] = {
        "prompt_ids": example.prompt_ids[:, prompt_cap - prompt_keep :],
        "prompt_mask": example.prompt_mask[:, prompt_cap - prompt_keep :],
    }
    if completions:
        completion_used = np.asarray(np.asarray(example.completion_mask).any(axis=0))
        cap = completion_used.shape[0]
        last = cap - int(np.argmax(completion_used[::-1])) if completion_used.any() else 0
        keep = padded_width(last, multiple, cap)
        for name in (
            "completion_ids",
            "completion_mask",
            "ref_per_token_logps",
            "old_per_token_logps",
            "sampler_is_weights",
        ):
            value = getattr(example, name, None)
            if value is not None:
                fields[name] = value[:, :keep]
    return example.replace(**fields)


def transform_train_examples(
    learner: Any, transform: Callable[[rl_common.TrainExample], rl_common.TrainExample]
) -> None:
    """Hand the actor update, on this learner only, `transform(example)` for each step's
    training example (trim_train_example, stages/grpo/advantages.informative_rows).

    Tunix 0.1.7's GRPO learner builds each step's example (rollouts, rewards, advantages,
    padded to the recipe's caps) in its private `_generate_and_compute_advantage`, whose
    result goes straight to the micro-batch split and the actor update; this wraps it on the
    instance. The split slices rows by the step's row count, so a transform that drops rows
    needs one micro-batch a step (the recipe checks it). Test:
    tests/unit/test_grpo_padding.py (the wrapped learner hands out the transformed example;
    the method exists on Tunix's GRPOLearner).
    """
    produce = learner._generate_and_compute_advantage

    def transformed(*args: Any, **kwargs: Any) -> rl_common.TrainExample:
        return transform(produce(*args, **kwargs))

    learner._generate_and_compute_advantage = transformed


# --- SFT's loss: logits at the loss positions only ----------------------------------------------

# Tunix 0.1.7's PeftTrainer loss, kept for the models the replacement does not handle.
TUNIX_SFT_LOSS = peft_trainer._default_loss_fn


def loss_positions(input_mask: Any) -> int:
    """The most next-token targets any row of an SFT split has (input_mask[:, 1:] summed), the
    `keep` of `target_positions_loss`; at least 1."""
    return max(1, int(np.asarray(input_mask)[:, 1:].sum(axis=1).max()))  # host arrays


def target_positions_loss(keep: int) -> Callable[..., jax.Array]:
    """PeftTrainer's next-token loss with the output projection at the loss positions only.

    Tunix 0.1.7's default SFT loss (`peft_trainer._default_loss_fn`, private) projects every
    position of the row to the 262,144-token vocabulary, takes a full log-softmax, multiplies
    it by a one-hot of the targets (another [rows x positions x vocabulary] array) and masks
    all but the completion: on the demo's rows (95 target positions, at most 32 in the loss)
    two thirds of the projection, forward and backward, is thrown away. Here the model runs
    to its final norm (`output_hidden_states`, a public argument, as in
    completion_per_token_logps), the `keep` hidden states that predict loss targets are
    gathered (in order; rows with fewer are padded with weight-0 positions), and only those
    are projected (through `projection.token_logps`, as the GRPO log-probs). Same
    normalisation (the mask's sum); only the sums' order differs: loss and gradients equal
    Tunix's to float rounding (test).
    `keep` must be at least every row's target count (`loss_positions` of the split). Images
    and other model families go to Tunix's loss unchanged.
    """

    def loss_fn(
        model: Any,
        input_tokens: jax.Array,
        input_mask: jax.Array,
        positions: jax.Array,
        attention_mask: jax.Array,
        images: jax.Array | None = None,
    ) -> jax.Array:
        if images is not None or not isinstance(model, gemma3_model.Gemma3):
            return TUNIX_SFT_LOSS(
                model, input_tokens, input_mask, positions, attention_mask, images
            )
        model(input_tokens, positions, None, attention_mask, output_hidden_states=True)
        hidden = _final_hidden(model)[:, :-1]
        target_mask = input_mask[:, 1:]
        # the loss positions first, in order (a stable sort of "not in the loss")
        order = jnp.argsort(~target_mask.astype(bool), axis=1, stable=True)[:, :keep]
        weights = jnp.take_along_axis(target_mask, order, axis=1).astype(hidden.dtype)
        targets = jnp.take_along_axis(input_tokens[:, 1:], order, axis=1)
        logps = projection.token_logps(
            jnp.take_along_axis(hidden, order[..., None], axis=1),
            model.embedder.input_embedding.value,
            targets,
        )
        return -jnp.sum(logps * weights) / (jnp.sum(target_mask) + 1e-8)

    return loss_fn


# --- LoRA's backward: the adapters' gradients without a transposed activation gradient ------

# qwix's LoRA delta, kept for the shapes the replacement does not handle (and for the test).
QWIX_COMPUTE_LORA_DELTA = qwix_lora._compute_lora_delta
TESTED_QWIX_VERSIONS = ("0.1.8",)


@jax.custom_vjp
def _low_rank_product(x: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """(x @ a) @ b over x's last axis: the products qwix's `_compute_lora_delta` makes."""
    return _low_rank_forward(x, a, b)[0]


def _contract(x: jax.Array, y: jax.Array, x_axis: int, y_axis: int) -> jax.Array:
    return jax.lax.dot_general(x, y, (((x_axis,), (y_axis,)), ((), ())))


def _low_rank_forward(x: jax.Array, a: jax.Array, b: jax.Array) -> tuple[jax.Array, Any]:
    down = _contract(x, a, x.ndim - 1, 0)  # as qwix: dot_general(lhs, a), then (., b)
    return _contract(down, b, down.ndim - 1, 0), (x, down, a, b)


def _low_rank_backward(saved: Any, grad: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The three products of autodiff's transpose, each contracting the positions axis with
    the positions-major operands as they are (autodiff's order makes XLA CPU write the
    activation gradient transposed first)."""
    x, down, a, b = saved
    rows = x.reshape(-1, x.shape[-1])
    down_rows = down.reshape(-1, down.shape[-1])
    grad_rows = grad.reshape(-1, grad.shape[-1])
    grad_down = _contract(grad_rows, b, 1, 1)  # [positions, rank]
    d_b = _contract(grad_rows, down_rows, 0, 0).T  # [out, rank] -> [rank, out]
    d_a = _contract(grad_down, rows, 0, 0).T  # [rank, in] -> [in, rank]
    d_x = _contract(grad_down, a, 1, 1).reshape(x.shape)
    return d_x, d_a, d_b


_low_rank_product.defvjp(_low_rank_forward, _low_rank_backward)


def _lora_delta(
    lhs: jax.Array,
    lora_a: jax.Array,
    lora_b: jax.Array,
    lhs_ca: Any,
    lhs_ba: Any,
    contract_shape: Any,
    batch_shape: Any,
    remain_shape: Any,
    rank: int,
    precision: Any = None,
) -> jax.Array:
    """qwix's `_compute_lora_delta` for a linear layer (one contracting axis, lhs's last; no
    batch axes; default precision) through `_low_rank_product`; any other shape to qwix's.

    qwix 0.1.8 computes a LoRA linear layer's delta as (x @ A) @ B with two dot_generals
    (`_compute_lora_delta`, private) and leaves the backward to autodiff. On XLA CPU the
    transpose of the second product, dB = (x A)^T g, makes XLA materialise the incoming
    gradient g transposed ([hidden x positions]) in a fusion of its own for every adapted
    layer (docs/performance.md). The written-out backward makes the same three products,
    contracting the positions axis of the operands as they lie. qwix reads the function from
    its module at each call: the fast path "lora_backward" (stages/modeling/fast_paths.py)
    assigns it there, on the tested qwix versions only.
    Test: tests/unit/test_lora_backward.py shows the transposed fusion in qwix's compiled
    gradient and equal gradients without it."""
    linear = (
        not batch_shape
        and not lhs_ba
        and tuple(lhs_ca) == (lhs.ndim - 1,)
        and len(contract_shape) == 1
        and len(remain_shape) == 1
        and precision is None
    )
    if not linear:
        return QWIX_COMPUTE_LORA_DELTA(
            lhs,
            lora_a,
            lora_b,
            lhs_ca,
            lhs_ba,
            contract_shape,
            batch_shape,
            remain_shape,
            rank,
            precision=precision,
        )
    return _low_rank_product(lhs, lora_a, lora_b)
