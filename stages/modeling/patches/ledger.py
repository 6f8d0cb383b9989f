"""Every adaptation of Tunix, qwix, Orbax and JAX internals FAR makes, declared as data.

Each entry says what it changes or reads (the upstream symbols), why, the versions it was
written against, the upstream issue (or, where none is filed, the report to file: docs/
tunix-patches.md prints it), when it can go, and the test that shows the upstream behaviour it
answers. That test asserts the behaviour is still there, so it fails once upstream changes it:
then the entry, and the code it names, can be removed or re-checked. docs/tunix-patches.md is
generated from this list (`python -m flows.gen_docs`; tests/unit/test_docs.py keeps it current)
and tests/unit/test_patch_ledger.py checks that each code and test it names exists.

Kinds: "defect" works around an upstream bug; "gap" adds what upstream lacks (FAR's resume and
lease needs, a faster path); "private" only reads or wraps private upstream attributes.
Installed: "import" (process-wide when FAR is imported), "stage" (a fast path, only while a
stage that asked runs: stages/modeling/fast_paths.py), "instance" (on one object FAR built),
"handed" (a function or class FAR passes to an upstream parameter), "call" (FAR's own call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TUNIX = (("google-tunix", "0.1.7"),)
TUNIX_JAX = (("google-tunix", "0.1.7"), ("jax", "0.10.2"))
QWIX = (("qwix", "0.1.8"),)
ORBAX = (("orbax-checkpoint", "0.12.8"),)
TUNIX_ORBAX = (("google-tunix", "0.1.7"), ("orbax-checkpoint", "0.12.8"))


@dataclass(frozen=True)
class Patch:
    """One adaptation of an upstream library."""

    id: str
    """A short stable name (the anchor of its report in docs/tunix-patches.md)."""
    kind: Literal["defect", "gap", "private"]
    """What it answers: an upstream bug, something upstream lacks, or a private attribute."""
    installed: Literal["import", "stage", "instance", "handed", "call"]
    """How far it reaches (see the module docstring)."""
    targets: tuple[str, ...]
    """The upstream symbols it replaces, wraps or reads, as module.Name.attribute."""
    code: str
    """FAR's side, as module:name."""
    why: str
    """The upstream behaviour and what it would do to FAR without this."""
    versions: tuple[tuple[str, str], ...]
    """(distribution, version) pairs it was written and tested against."""
    remove_when: str
    """The upstream change after which the entry and its code can go."""
    test: str
    """The test that shows the upstream behaviour (it fails once upstream changes it)."""
    upstream: str | None = None
    """The upstream issue or pull request; None where none is filed (then `report`)."""
    report: str | None = None
    """Where no issue is filed: the report's text, ready to file upstream."""


LEDGER: tuple[Patch, ...] = (
    Patch(
        id="rl-resume-fast-forward",
        kind="defect",
        installed="instance",
        targets=("tunix.rl.rl_learner.RLLearner._last_iter_step",),
        code="stages.modeling.tunix_compat:skip_tunix_fast_forward",
        why=(
            "On resume RLLearner.train() skips actor_trainer.iter_steps micro-batches of the "
            "data it is handed; that counts trainer loops, not consumed micro-batches, so with "
            "num_iterations > 1 it skips the wrong data. FAR's GRPO stage already starts its "
            "prompt stream at the first untrained batch, so any skip drops batches twice."
        ),
        versions=TUNIX,
        upstream="https://github.com/google/tunix/issues/2290",
        remove_when=(
            "#2290 is fixed and FAR's GRPO stage hands Tunix the stream from its start, "
            "letting Tunix's corrected fast-forward do the skipping"
        ),
        test="tests/unit/test_patch_ledger.py::test_tunix_fast_forwards_by_trainer_loops",
    ),
    Patch(
        id="rl-resume-global-step",
        kind="defect",
        installed="call",
        targets=("tunix.rl.rl_cluster.RLCluster.global_steps",),
        code="stages.modeling.tunix_compat:resync_after_restore",
        why=(
            "The final checkpoint written by the trainer's close() has empty custom metadata, "
            "so a run resumed from a cleanly finished one restarts its global step at 0 (step "
            "metrics, seeds and the learning-rate schedule would repeat)."
        ),
        versions=TUNIX,
        remove_when="a checkpoint written by close() restores its global step",
        test=(
            "tests/integration/test_grpo_full.py::"
            "test_resume_fixes_tunix_global_step_and_rollout_weights"
        ),
        report=(
            "RLCluster: global_steps restored as 0 from the checkpoint close() writes. "
            "PeftTrainer.close() saves a final checkpoint without custom_metadata, so "
            "RLCluster reads global_steps 0 when a run is resumed from it. Reproduce: train "
            "GRPO 3 steps with checkpoint_root_directory set, let it finish, build a new "
            "RLCluster on the same directory: actor_trainer restores step 3, global_steps is 0. "
            "Expected: 3."
        ),
    ),
    Patch(
        id="rl-resume-rollout-weights",
        kind="defect",
        installed="call",
        targets=("tunix.rl.rl_cluster.RLCluster.sync_weights",),
        code="stages.modeling.tunix_compat:resync_after_restore",
        why=(
            "With a rollout model apart from the actor (another mesh), the restored adapters "
            "reach the rollout model only at the first sync: the first step samples from the "
            "pre-restore policy. (With shared variables a sync must not happen: it replaces "
            "the sampler's variables with copies Tunix never updates again.)"
        ),
        versions=TUNIX,
        remove_when="RLCluster syncs the rollout model after restoring the actor",
        test=(
            "tests/integration/test_grpo_full.py::"
            "test_resume_fixes_tunix_global_step_and_rollout_weights"
        ),
        report=(
            "RLCluster: a restored actor is not pushed to a separate rollout model. With "
            "the rollout on its own mesh, restoring the actor's LoRA checkpoint leaves the "
            "rollout model at its initial weights until the first sync_weights(), so the first "
            "step after a resume samples from the stale policy. Expected: sync once after "
            "maybe_restore when should_sync_weights."
        ),
    ),
    Patch(
        id="rollout-seed-per-call",
        kind="defect",
        installed="handed",
        targets=("tunix.rl.rollout.vanilla_rollout.VanillaRollout.generate",),
        code="stages.modeling.tunix_compat:SeededRollout",
        why=(
            "RolloutConfig.seed goes unchanged to every generate call, so every GRPO step "
            "samples with the same PRNG key (seed None: PRNGKey(0) each time). FAR hands "
            "RLCluster its own engine that seeds each call from (global step, call)."
        ),
        versions=TUNIX,
        remove_when="the rollout derives a fresh key per call (or takes a per-step seed)",
        test="tests/unit/test_patch_ledger.py::test_tunix_rollout_samples_every_call_with_one_seed",
        report=(
            "VanillaRollout: every generate call samples with the same PRNG key. "
            "VanillaRollout.generate passes RolloutConfig.seed unchanged to the sampler, so "
            "each GRPO step draws its completions from the same key (with seed None, "
            "PRNGKey(0) every step): the groups of step n and step n+1 share their noise. "
            "Expected: a key folded in with the global step (or split per call)."
        ),
    ),
    Patch(
        id="rl-shuffle-resume",
        kind="defect",
        installed="call",
        targets=("tunix.rl.rl_learner.RLLearner",),
        code="stages.grpo.training:prompt_batches",
        why=(
            "Resuming an RL run resets the data-shuffle PRNG. FAR never lets Tunix shuffle: "
            "its GRPO stage orders the prompts itself (seeded, deterministic) and streams them."
        ),
        versions=TUNIX,
        upstream="https://github.com/google/tunix/issues/2288",
        remove_when="never needed by FAR's own ordering; listed so an upgrade re-checks it",
        test="tests/integration/test_grpo_full.py::test_kill_9_then_rerun_equals_an_uninterrupted_run",
    ),
    Patch(
        id="jax-listeners-cleared",
        kind="defect",
        installed="call",
        targets=("tunix.sft.metrics_logger.MetricsLogger.close",),
        code="stages.modeling.tunix_compat:unregister_duration_listener",
        why=(
            "MetricsLogger.close() clears every jax.monitoring event and duration listener, "
            "FAR's compile counters included; JAX then raises AssertionError when FAR "
            "unregisters its own."
        ),
        versions=TUNIX_JAX,
        remove_when="MetricsLogger.close() removes only the listeners it registered",
        test="tests/unit/test_patch_ledger.py::test_tunix_metrics_logger_close_removes_others_listeners",
        report=(
            "MetricsLogger.close() removes every jax.monitoring listener of the process. "
            "close() calls jax.monitoring.clear_event_listeners(), which also drops listeners "
            "other code registered (compile-time counters of the application that trains), "
            "whose later unregister then raises AssertionError. Expected: close() unregisters "
            "the listeners its backends registered, and only those."
        ),
    ),
    Patch(
        id="jax-scalar-listeners-leak",
        kind="defect",
        installed="call",
        targets=("jax.monitoring.clear_event_listeners", "tunix.sft.metrics_logger.MetricsLogger"),
        code="stages.modeling.tunix_compat:release_scalar_listeners",
        why=(
            "jax.monitoring.clear_event_listeners() does not clear scalar listeners (it "
            "assigns a local), which MetricsLogger.close() relies on: a closed TensorBoard "
            "backend keeps receiving every later stage's scalars and writes into the "
            "finished stage's directory."
        ),
        versions=TUNIX_JAX,
        remove_when="clear_event_listeners clears scalar listeners (or close() unregisters them)",
        test=(
            "tests/unit/test_tunix_compat.py::"
            "test_closed_metrics_logger_keeps_listening_until_released"
        ),
        report=(
            "(jax-ml/jax) jax.monitoring.clear_event_listeners() leaves scalar listeners "
            "registered: it assigns a local `_scalar_listeners` instead of clearing the module's "
            "list. A listener registered with register_scalar_listener still receives "
            "record_scalar calls after clear_event_listeners(). Expected: cleared."
        ),
    ),
    Patch(
        id="orbax-async-save-error",
        kind="defect",
        installed="call",
        targets=(
            "tunix.sft.checkpoint_manager.CheckpointManager._checkpoint_manager",
            "orbax.checkpoint.CheckpointManager._finalize_thread",
        ),
        code="stages.modeling.tunix_compat:raise_save_errors",
        why=(
            "A failed asynchronous save (a full disk) is kept by Orbax's finalize thread and "
            "raised only when joined at the next save, many steps later; the public "
            "check_for_errors misses it once that thread consumed the error."
        ),
        versions=TUNIX_ORBAX,
        remove_when="CheckpointManager.check_for_errors reports a finished save's failure",
        test="tests/unit/test_full_disk.py::test_a_failed_async_orbax_save_is_raised_at_the_next_step",
        report=(
            "(google/orbax) CheckpointManager.check_for_errors() misses a failed async "
            "finalize. When the background finalize of an async save fails (ENOSPC), the "
            "exception is stored on _finalize_thread and raised only when that thread is "
            "joined by the next save; check_for_errors() returns normally in between. "
            "Expected: check_for_errors() raises it as soon as the thread has finished."
        ),
    ),
    Patch(
        id="checkpoint-write-fence",
        kind="gap",
        installed="import",
        targets=(
            "tunix.sft.checkpoint_manager.CheckpointManager.save",
            "orbax.checkpoint._src.path.atomicity.AtomicRenameTemporaryPath.finalize",
            "orbax.checkpoint._src.path.atomicity.CommitFileTemporaryPath.finalize",
            "orbax.checkpoint._src.path.deleter.StandardCheckpointDeleter.delete",
        ),
        code="stages.modeling.tunix_compat:fence_checkpoint_writes",
        why=(
            "FAR's lease: a holder stopped past its lease and continued must not write, "
            "commit or delete a checkpoint step in a directory its successor committed. "
            "Neither Tunix nor Orbax offers a hook before a write or a commit, so the four "
            "calls are wrapped on their classes (every trainer of every stage saves through "
            "them; outside a stage's work the fence is a no-op)."
        ),
        versions=TUNIX_ORBAX,
        remove_when="Orbax (or Tunix's CheckpointManager) takes a pre-write/pre-commit callback",
        test=(
            "tests/unit/test_checkpoint_fence.py::"
            "test_a_save_under_way_when_the_lease_is_lost_is_never_committed"
        ),
        report=(
            "(google/orbax) A hook before each checkpoint write, commit and delete. A "
            "trainer that may have lost ownership of its checkpoint directory (a lease "
            "expired while the process was stopped) needs to refuse the write, the "
            "finalize (rename or commit file) and the max_to_keep delete. Proposal: an "
            "optional callable in CheckpointManagerOptions called before each, whose "
            "exception aborts the operation."
        ),
    ),
    Patch(
        id="restore-newest-intact",
        kind="gap",
        installed="import",
        targets=("tunix.sft.checkpoint_manager.CheckpointManager.maybe_restore",),
        code="stages.modeling.tunix_compat:restore_newest_intact",
        why=(
            "maybe_restore restores the latest step and lets Orbax's error out as a "
            "traceback when that step is damaged (a file deleted or torn); FAR moves the "
            "step aside and falls back to the newest step that restores. The reads Orbax "
            "leaves under way then meet its closed event loop, which Python prints as "
            "tracebacks, at any time: from the first restore on they go to the log at DEBUG."
        ),
        versions=TUNIX_ORBAX,
        remove_when="maybe_restore falls back to an earlier intact step (or takes an option to)",
        test=(
            "tests/integration/test_sft_full.py::"
            "test_a_deleted_checkpoint_file_falls_back_to_the_previous_step_then_fails_in_one_line"
        ),
        report=(
            "CheckpointManager.maybe_restore: no fallback from a damaged latest step. A "
            "latest step with a missing or torn file fails the whole resume with Orbax's "
            "traceback although earlier steps (max_to_keep) are intact. Proposal: an "
            "option to try the next older step, reporting the damaged one."
        ),
    ),
    Patch(
        id="peft-progress-bar",
        kind="private",
        installed="instance",
        targets=("tunix.sft.peft_trainer.PeftTrainer._pbar",),
        code="stages.modeling.tunix_compat:hide_progress_bar",
        why=(
            "PeftTrainer (GRPO's actor trainer too) draws its own tqdm bar on a terminal; "
            "FAR draws the stage's, so Tunix's would be a second one. A stand-in _pbar keeps "
            "it from drawing."
        ),
        versions=TUNIX,
        remove_when="TrainingConfig takes an option to draw no progress bar",
        test="tests/integration/test_tunix_progress_bar.py::test_tunix_draws_its_bar_on_a_terminal_unless_hidden",
        report=(
            "PeftTrainer: an option to draw no progress bar. Applications that draw their "
            "own progress cannot turn off the trainer's tqdm bar except by setting the private "
            "_pbar. Proposal: TrainingConfig(progress_bar=False)."
        ),
    ),
    Patch(
        id="rl-metrics-logger-private",
        kind="private",
        installed="call",
        targets=("tunix.rl.rl_cluster.RLCluster._rl_metrics_logger",),
        code="stages.modeling.tunix_compat:cluster_metrics_loggers",
        why="FAR releases both of a cluster's MetricsLoggers after training; one is private.",
        versions=TUNIX,
        remove_when="RLCluster exposes its RL metrics logger (or closes its listeners itself)",
        test="tests/unit/test_patch_ledger.py::test_the_private_attributes_far_reads_exist",
        report=(
            "RLCluster: expose the RL MetricsLogger. It is kept as _rl_metrics_logger; "
            "an application that must release its jax.monitoring listeners after training "
            "can reach it only privately."
        ),
    ),
    Patch(
        id="grpo-phase-timing",
        kind="private",
        installed="instance",
        targets=(
            "tunix.rl.grpo.grpo_learner.GRPOLearner._compute_rewards",
            "tunix.rl.rollout.vanilla_rollout.VanillaRollout._sampler",
            "tunix.generate.sampler.Sampler._compiled_prefill_fn",
            "tunix.generate.sampler.Sampler._compiled_decode_fn",
        ),
        code="stages.modeling.tunix_compat:wrap_grpo_phases",
        why=(
            "Tunix's tracer reports neither rewards nor checkpoint saves, and its spans are "
            "private; FAR times each phase by wrapping the methods on its own instances."
        ),
        versions=TUNIX,
        remove_when="Tunix's perf tracer reports every phase through a public interface",
        test=(
            "tests/integration/test_grpo_timing.py::"
            "test_each_phase_is_timed_per_step_and_rolled_out_in_one_call"
        ),
        report=(
            "RL perf tracer: rewards and checkpoint saves are not timed, and the spans "
            "are private. Proposal: public per-phase timings in the step metrics (rollout "
            "prefill and decode, rewards, reference/old log-probs, update, sync, save)."
        ),
    ),
    Patch(
        id="grpo-example-transform",
        kind="private",
        installed="instance",
        targets=("tunix.rl.grpo.grpo_learner.GRPOLearner._generate_and_compute_advantage",),
        code="stages.modeling.tunix_compat:transform_train_examples",
        why=(
            "Each step's training example (padded to the recipe's caps, every prompt repeated "
            "num_generations times) goes straight to the update; FAR trims unused columns, "
            "drops flat groups and keeps one prompt row per group by wrapping the private "
            "method on its learner."
        ),
        versions=TUNIX,
        remove_when="GRPOLearner takes a transform of the train example",
        test="tests/unit/test_grpo_padding.py::test_the_learner_hands_the_actor_the_cut_example",
        report=(
            "GRPOLearner: a hook on each step's TrainExample. Trimming all-padding columns "
            "and dropping zero-advantage groups before the update saves work with equal "
            "gradients; today it needs wrapping _generate_and_compute_advantage. Proposal: "
            "an optional example_transform callable in the learner's config."
        ),
    ),
    Patch(
        id="gemma3-qk-norm-private",
        kind="private",
        installed="call",
        targets=(
            "tunix.models.gemma3.model.Attention._query_norm",
            "tunix.models.gemma3.model.Attention._key_norm",
        ),
        code="stages.modeling.tunix_compat:gemma3_qk_norm_scales",
        why="Exporting Gemma 3 weights needs the query/key norm scales, kept private.",
        versions=TUNIX,
        remove_when="Gemma 3's attention exposes its query and key norms",
        test="tests/unit/test_patch_ledger.py::test_the_private_attributes_far_reads_exist",
        report=(
            "Gemma 3 Attention: public query/key norms. Export to other formats needs "
            "_query_norm and _key_norm; a public name would survive refactors."
        ),
    ),
    Patch(
        id="rope-theta-ignored",
        kind="defect",
        installed="import",
        targets=("tunix.models.llama3.model", "tunix.models.qwen3.model"),
        code="stages.modeling.rope_adaptation:install",
        why=(
            "Llama 3 and Qwen 3 attention apply apply_rope's default base whatever the "
            "config's rope_theta, and no scaling: FAR wraps each family's attention block so "
            "the checkpoint's rope_theta and Llama 3's `llama3` scaling (transformers' "
            "frequencies) reach it; other RoPE types are refused before loading. Installed "
            "process-wide the first time FAR loads the family's network module."
        ),
        versions=TUNIX,
        remove_when="the attention blocks pass the config's rope_theta and scaling to apply_rope",
        test="tests/unit/test_rope_adaptation.py::test_tunix_still_ignores_the_config_base",
        report=(
            "Llama 3 / Qwen 3: attention ignores ModelConfig.rope_theta. The attention "
            "blocks call apply_rope without the config's rope_theta, so the default base is "
            "used for every checkpoint; weights trained with another base (or rope scaling) "
            "give wrong logits. Expected: the config's rope_theta (and scaling) reach apply_rope."
        ),
    ),
    Patch(
        id="gemma3-decode-only-last-token",
        kind="gap",
        installed="stage",
        targets=("tunix.models.gemma3.model.Gemma3.__call__",),
        code="stages.modeling.tunix_compat:_gemma3_call",
        why=(
            "The Sampler asks the model's prefill for the last position's logits only when "
            "__call__ accepts decode_only_last_token; Gemma 3's does not, so every prompt "
            "position is projected to the vocabulary and all but one thrown away (fast path "
            "prefill_last_position)."
        ),
        versions=TUNIX,
        remove_when="Gemma3.__call__ accepts decode_only_last_token",
        test="tests/unit/test_prefill_last_position.py::test_tunix_alone_projects_every_prompt_position",
        report=(
            "Gemma3.__call__ does not accept decode_only_last_token. Sampler checks the "
            "model's signature and, for Gemma 3, prefills with full-vocabulary logits at every "
            "prompt position although _sample reads only logits[:, -1]. Proposal: accept the "
            "argument and project only the last position (same logits, bit for bit)."
        ),
    ),
    Patch(
        id="rl-logps-full-sequence",
        kind="gap",
        installed="stage",
        targets=(
            "tunix.rl.common.compute_per_token_logps",
            "tunix.rl.algo_core.compute_entropy_from_logits",
        ),
        code="stages.modeling.tunix_compat:completion_per_token_logps",
        why=(
            "Every RL log-prob (actor loss, reference, old policy) projects prompt and "
            "completion to full-vocabulary logits, then slices the completion's; the entropy "
            "decodes them a second time. FAR projects the completion positions only and "
            "computes the entropy from that projection (fast path completion_logps)."
        ),
        versions=TUNIX,
        remove_when="compute_per_token_logps projects only the completion positions",
        test=(
            "tests/integration/test_completion_logits.py::"
            "test_tunix_projects_the_prompt_to_the_vocabulary_too"
        ),
        report=(
            "compute_per_token_logps projects the prompt positions too. The model's full "
            "logits over prompt + completion are computed and then sliced to the "
            "completion; XLA does not move the slice before the vocabulary matmul. Proposal: "
            "take the hidden states (output_hidden_states) and project only the positions "
            "that predict completion tokens; derive the entropy from the same projection."
        ),
    ),
    Patch(
        id="sampler-gumbel-draw",
        kind="gap",
        installed="stage",
        targets=("tunix.generate.sampler.Sampler._sample", "tunix.generate.sampler.sample_top_p"),
        code="stages.modeling.tunix_compat:_sample_by_draw",
        why=(
            "Unfiltered sampling (top_p 1, no top_k) draws by Gumbel-max: one random number "
            "per vocabulary entry and row. FAR's inverse-CDF draw takes one per row, from the "
            "same distribution (fast path draw; a recipe choice, other tokens per seed)."
        ),
        versions=TUNIX,
        remove_when="the Sampler takes a draw function (or draws by inverse CDF itself)",
        test=(
            "tests/unit/test_sampling.py::"
            "test_tunix_draws_a_number_per_vocabulary_entry_this_draws_one_per_row"
        ),
        report=(
            "Sampler: unfiltered sampling draws a random number per vocabulary entry. "
            "sample_top_p at top_p 1 calls jax.random.categorical (Gumbel-max), "
            "rows x vocabulary random numbers per decode step, which at a 262k vocabulary "
            "costs more than the step's weight products on CPU. Proposal: an inverse-CDF "
            "draw (one uniform per row) or a pluggable draw."
        ),
    ),
    Patch(
        id="sampler-vocab-table",
        kind="gap",
        installed="stage",
        targets=("tunix.models.gemma3.model.Embedder.decode",),
        code="stages.modeling.tunix_compat:attach_vocab_table",
        why=(
            "grpo.sampler_projection bfloat16: the rollout's vocabulary projection reads a "
            "bfloat16 copy of the tied embedding (fast path vocab_table). A FAR recipe "
            "choice, not an upstream defect; listed because it swaps Embedder.decode."
        ),
        versions=TUNIX,
        remove_when="the sampler takes its own projection dtype",
        test="tests/unit/test_vocab_table.py::test_the_sampler_projects_through_the_bfloat16_table",
        report=(
            "Sampler: a projection dtype of its own. Sampling through a bfloat16 copy of a "
            "tied embedding halves the decode step's largest read; today the copy needs "
            "replacing Embedder.decode. Proposal: a sampler option for the logits' dtype."
        ),
    ),
    Patch(
        id="qwix-lora-backward",
        kind="gap",
        installed="stage",
        targets=("qwix._src.providers.lora._compute_lora_delta",),
        code="stages.modeling.tunix_compat:_lora_delta",
        why=(
            "qwix leaves a LoRA linear layer's backward to autodiff, whose transpose makes XLA "
            "CPU write each adapted layer's incoming gradient transposed; FAR's written-out "
            "backward makes the same products without the copy (fast path lora_backward)."
        ),
        versions=QWIX,
        remove_when="qwix's compiled LoRA gradient has no transposed gradient copy",
        test=(
            "tests/unit/test_lora_backward.py::"
            "test_qwix_transposes_the_gradient_and_the_written_out_backward_does_not"
        ),
        report=(
            "(google/qwix) LoRA backward: a transposed copy of the incoming gradient per "
            "layer on XLA CPU. _compute_lora_delta's (x @ A) @ B leaves dB = (xA)^T g to "
            "autodiff, which materialises g transposed ([hidden x positions]) in its own "
            "fusion. Proposal: a custom_vjp contracting the positions axis of the operands "
            "as they lie (same gradients, bit for bit)."
        ),
    ),
    Patch(
        id="grpo-prompts-repeated",
        kind="gap",
        installed="instance",
        targets=("tunix.generate.sampler.Sampler._compiled_prefill_fn",),
        code="stages.modeling.tunix_compat:SeededRollout",
        why=(
            "GRPO repeats every prompt num_generations times, and the rollout's prefill and "
            "the actor update run each copy through the model; grpo.share_prompts runs each "
            "group's prompt once (the prefill on FAR's engine, the update through "
            "completion_per_token_logps)."
        ),
        versions=TUNIX,
        remove_when="Tunix's GRPO prefills and trains each group's prompt once",
        test="tests/unit/test_shared_prefill.py::test_the_shared_prefill_samples_the_same_completions",
        report=(
            "GRPO: each group's prompt runs through the model num_generations times. "
            "Proposal: prefill each distinct prompt once and repeat its KV cache for the "
            "group, in the rollout and in the actor's log-probs (equal to rounding)."
        ),
    ),
    Patch(
        id="sft-loss-all-positions",
        kind="gap",
        installed="handed",
        targets=("tunix.sft.peft_trainer._default_loss_fn",),
        code="stages.modeling.tunix_compat:target_positions_loss",
        why=(
            "PeftTrainer's default loss projects every position to the vocabulary and masks "
            "all but the loss targets; FAR hands the trainer a loss (with_loss_fn) that "
            "projects the target positions only."
        ),
        versions=TUNIX,
        remove_when="the default SFT loss projects only the loss positions",
        test=(
            "tests/unit/test_sft_loss_positions.py::"
            "test_the_loss_at_its_positions_equals_tunixs_and_skips_the_rest"
        ),
        report=(
            "PeftTrainer default loss: full-vocabulary logits at every position. The "
            "one-hot cross-entropy over [rows x positions x vocabulary] is masked to the "
            "completion afterwards. Proposal: gather the hidden states at the loss positions "
            "and project only those."
        ),
    ),
)


def by_id() -> dict[str, Patch]:
    """The ledger by entry id."""
    return {patch.id: patch for patch in LEDGER}
