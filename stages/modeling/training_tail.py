"""The tail of a Tunix training session, written once for every stage that trains.

SFT, DPO/ORPO, distillation and GRPO end a session the same way: hand the trainer a batch
stream that stops before the deadline (or on a stop request, or once a background checkpoint
save failed), train on the mesh, detach the closed metrics loggers from jax.monitoring,
publish the local checkpoints and logs (SessionExpired when short of `max_steps`), describe
the committed checkpoint, and read the loss history. This is the resume and commit glue, so
it lives here once: a stage keeps what differs, its trainer, its data and its metrics.

A session that stops short keeps its curves in the stage's `history/` directory (one file per
session, named by the steps it trained), so the committed record's history holds every
session's steps, not only the last one's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grain

from schemas.artifacts import CheckpointArtifact
from schemas.recipe import LoraSpec, ModelSpec
from stages.core import storage
from stages.core.checkpoints import committed_checkpoint, publish_session, train_curve
from stages.core.runner import RunContext
from stages.core.sessions import StepClock, guarded
from stages.modeling import tunix_compat
from stages.modeling.compilations import CompileCounter, counting_compilations

CHECKPOINT_DIR = "checkpoints"  # carried over from a stopped session's directory
LOG_DIR = "tensorboard"
HISTORY_DIR = "history"  # a stopped session's curves, carried over like its checkpoints
CARRY_OVER = (CHECKPOINT_DIR, HISTORY_DIR)  # what a continuable change brings to its directory

Curves = dict[str, list[float]]


@dataclass(frozen=True)
class SessionDirs:
    """Where a training session's Orbax checkpoints and metric logs go."""

    ckpt_uri: str
    """The stage's checkpoint root in storage."""
    log_uri: str
    """The stage's TensorBoard directory in storage."""
    local_ckpt: str
    """The local directory Tunix saves checkpoints to (`ckpt_uri` itself when local)."""
    local_logs: str
    """The local directory Tunix writes its logs to (`log_uri` itself when local)."""
    history_uri: str
    """Where each stopped session's curves wait for the commit (one JSON file a session)."""


def session_dirs(directory: str) -> SessionDirs:
    """The checkpoint and log directories of a stage directory.

    Args:
        directory: the stage's directory in storage (a local path or a remote URI).

    Returns:
        The storage URIs under `directory` and the local directories Tunix writes to.
    """
    ckpt_uri, log_uri = storage.join(directory, CHECKPOINT_DIR), storage.join(directory, LOG_DIR)
    local_ckpt, local_logs = storage.orbax_directory(ckpt_uri), storage.local_directory(log_uri)
    history_uri = storage.join(directory, HISTORY_DIR)
    return SessionDirs(ckpt_uri, log_uri, local_ckpt, local_logs, history_uri)


def keep_curves(history_uri: str, start_step: int, end_step: int, curves: Curves) -> None:
    """Keep a stopped session's curves (steps `start_step` to `end_step`) for the commit."""
    name = f"{start_step:08d}-{end_step:08d}.json"
    payload = {"start_step": start_step, "end_step": end_step, "curves": curves}
    storage.write_json(storage.join(history_uri, name), payload)


def earlier_curves(history_uri: str, start_step: int) -> tuple[list[Curves], int]:
    """The kept curves of the sessions that led to `start_step`, oldest first, and the step
    they begin at: 0 when every earlier session kept its curves; later when one did not (a
    session killed before its stop), whose steps the history then lacks.

    Args:
        history_uri: the stage's history directory.
        start_step: the step the committing session resumed at.

    Returns:
        The chain of curves ending at `start_step` (a part whose end is no later session's
        start, from a session whose checkpoint was never published, is left out) and its
        first step.
    """
    ends: dict[int, tuple[int, Curves]] = {}  # end step -> (start step, curves), read once
    for name in sorted(storage.list_files(history_uri)):
        part = storage.read_json(storage.join(history_uri, name))
        ends[int(part["end_step"])] = (int(part["start_step"]), part["curves"])
    chain, step = [], start_step
    while step > 0 and step in ends:
        step, curves = ends[step]
        chain.append(curves)
    return chain[::-1], step


def ends(values: Sequence[float]) -> tuple[float, float]:
    """A curve's first and last values (NaN for a curve with none: a record committed by a
    session that resumed at the last step, of a stage whose earlier sessions kept none)."""
    return (float(values[0]), float(values[-1])) if values else (float("nan"), float("nan"))


def joined_curves(parts: Sequence[Curves]) -> Curves:
    """Curves of consecutive sessions as one, each name's values in step order."""
    names = dict.fromkeys(name for part in parts for name in part)
    return {name: [v for part in parts for v in part.get(name, [])] for name in names}


def replayed_batches(records: Sequence[Any], batch_size: int, seed: int) -> grain.MapDataset:
    """The batch order a resumed session replays: seeded, shuffled, endlessly repeated.

    A Tunix trainer restored at step n reads and skips the first n batches (times its
    gradient accumulation), so they must be the very batches the earlier sessions trained on.

    Args:
        records: the training examples, one per row, as the trainer's batches hold them.
        batch_size: rows per batch; a last partial batch of an epoch is dropped.
        seed: the shuffle's seed.

    Returns:
        A grain MapDataset of batches (read it with stages.core.datasets.in_memory_stream).
    """
    return (
        grain.MapDataset.source(records)
        .seed(seed)
        .shuffle()
        .repeat()
        .batch(batch_size, drop_remainder=True)
    )


@dataclass
class TrainingTail:
    """One training session of a Tunix trainer, from its batch stream to its commit.

    Build it with `for_trainer` once the trainer has restored its checkpoint, then call
    `train`, `publish` and `commit` in that order (`run` does all three for a trainer that
    trains on the stream itself).
    """

    what: str
    """The stage's name in the stop messages ("SFT", "dpo", "GRPO", ...)."""
    trainer: Any
    """The Tunix trainer whose checkpoints and metrics logger the session uses."""
    dirs: SessionDirs
    """Where its checkpoints and logs go."""
    max_steps: int
    """The steps the stage trains in all, over its sessions."""
    save_margin_s: float
    """Seconds kept before the deadline for the final save."""
    start_step: int
    """The step the session resumed at (0 on a first session)."""
    steps_done: Callable[[], int]
    """The steps trained so far, read after training."""
    clock: StepClock = field(default_factory=lambda: StepClock())
    """When each batch was handed out (StepClock looked up when the tail is made, so a
    benchmark can record it: bench/roofline.py)."""
    compiles: CompileCounter = field(default_factory=lambda: CompileCounter(""))
    """The backend compilations seen while training (none before `train`)."""
    finished: float = float("nan")
    """When training returned, in time.time() seconds (NaN before `train`)."""

    @classmethod
    def for_trainer(
        cls, what: str, trainer: Any, dirs: SessionDirs, max_steps: int, save_margin_s: float
    ) -> TrainingTail:
        """The tail of a session whose steps are the trainer's own.

        Args:
            what: the stage's name in the stop messages.
            trainer: a Tunix PeftTrainer (or subclass), already restored from `dirs`.
            dirs: where its checkpoints and logs go.
            max_steps: the steps the stage trains in all.
            save_margin_s: seconds kept before the deadline for the final save.

        Returns:
            A tail that resumes at the trainer's restored step and counts its train_steps.
        """
        steps_done = lambda: int(trainer.train_steps)  # noqa: E731
        return cls(what, trainer, dirs, max_steps, save_margin_s, steps_done(), steps_done)

    def train(
        self,
        fit: Callable[[Iterator[Any]], Any],
        items: Iterator[Any],
        ctx: RunContext,
        mesh: Any,
        items_per_step: int = 1,
        report: Callable[[Iterator[Any]], Iterator[Any]] | None = None,
    ) -> None:
        """Train on `items` until they end, a stop is requested or the deadline is near.

        Args:
            fit: trains on the stream it is given and saves the last checkpoint (a trainer's
                `train`).
            items: the session's batches, from where the trainer resumes reading.
            ctx: the run's context (its deadline and stop flag).
            mesh: the device mesh the trainer runs on.
            items_per_step: micro-batches per optimizer update; a stop falls between windows.
            report: wraps the guarded stream to report progress (None: no progress).
        """
        stream = guarded(
            items,
            ctx.deadline,
            ctx.stop,
            self.save_margin_s,
            self.clock,
            items_per_step=items_per_step,
            # a failed async checkpoint save ends the session (checked in the data thread)
            health=lambda: tunix_compat.raise_save_errors(self.trainer),
        )
        # Tunix's close() at the end of train() clears every JAX listener: count inside
        with mesh, counting_compilations() as compiles:
            fit(stream if report is None else report(stream))
        self.compiles, self.finished = compiles, time.time()

    def publish(
        self,
        loggers: Iterable[Any] | None = None,
        curves: Callable[[], Curves] | None = None,
        primary: bool = True,
    ) -> None:
        """Detach the closed metrics loggers, keep the curves of a session that stops short,
        then publish the checkpoints and logs.

        Args:
            loggers: the Tunix MetricsLoggers the session wrote (None: the trainer's own).
            curves: this session's curves, as the record's history holds them (None: none
                kept; the record's history then holds the committing session's steps only).
            primary: whether this process writes the stage's files (process 0).

        Raises:
            SessionExpired: the session stopped short of `max_steps` (it resumes from there).
            NoProgress: the session stopped without taking a step.
        """
        for logger in [self.trainer.metrics_logger] if loggers is None else loggers:
            tunix_compat.release_scalar_listeners(logger)  # else they write into this stage
        steps = self.steps_done()
        if curves is not None and primary and self.start_step < steps < self.max_steps:
            keep_curves(self.dirs.history_uri, self.start_step, steps, curves())
        publish_session(
            self.what,
            self.steps_done(),
            self.max_steps,
            self.dirs.local_ckpt,
            self.dirs.ckpt_uri,
            self.dirs.local_logs,
            self.dirs.log_uri,
            start_step=self.start_step,
        )

    def commit(
        self,
        model: ModelSpec,
        tokenizer: str,
        lora: LoraSpec | None,
        subdir: str | None = None,
        step: int | None = None,
    ) -> CheckpointArtifact:
        """The published checkpoint as the stage's output artifact.

        Args:
            model: the trained model's spec.
            tokenizer: the tokenizer's name.
            lora: the LoRA adapters' spec (None: full weights).
            subdir: the checkpoint root under the stage's (GRPO's actor), None: the stage's.
            step: the committed step as the checkpoint numbers it (None: `max_steps`).

        Returns:
            The CheckpointArtifact, fingerprinted by the checkpoint's content.
        """
        uri = self.dirs.ckpt_uri if subdir is None else storage.join(self.dirs.ckpt_uri, subdir)
        return committed_checkpoint(
            uri, self.max_steps if step is None else step, model, tokenizer, lora
        )

    def run(
        self,
        items: Iterator[Any],
        ctx: RunContext,
        mesh: Any,
        model: ModelSpec,
        tokenizer: str,
        lora: LoraSpec | None,
        curves: Callable[[], Curves] | None = None,
        **train_options: Any,
    ) -> CheckpointArtifact:
        """`train` with the trainer's own `train`, then `publish` and `commit`.

        Args:
            items: the session's batches, from where the trainer resumes reading.
            ctx: the run's context (its deadline and stop flag).
            mesh: the device mesh the trainer runs on.
            model: the trained model's spec.
            tokenizer: the tokenizer's name.
            lora: the LoRA adapters' spec (None: full weights).
            curves: this session's curves, kept if it stops short (see `publish`).
            train_options: `items_per_step` and `report`, as `train` takes them.

        Returns:
            The committed CheckpointArtifact (SessionExpired or NoProgress when short).
        """
        self.train(self.trainer.train, items, ctx, mesh, **train_options)
        self.publish(curves=curves, primary=ctx.primary)
        return self.commit(model, tokenizer, lora)

    def curves(self, *names: str) -> dict[str, list[float]]:
        """The loss history: the session's values of training metrics.

        Args:
            names: the metrics' names as the trainer logs them ("loss", "learning_rate").

        Returns:
            Each name's values this session, in step order (empty when no step was taken).
        """
        return {name: train_curve(self.trainer.metrics_logger, name) for name in names}

    def whole_history(self, session: Curves) -> tuple[Curves, int]:
        """The record's history: the kept curves of the earlier sessions, then `session`'s.

        Args:
            session: this (the committing) session's curves.

        Returns:
            Every session's values in step order, and the step they begin at (0 unless an
            earlier session was killed before it could keep its curves).
        """
        parts, first_step = earlier_curves(self.dirs.history_uri, self.start_step)
        return joined_curves([*parts, session]), first_step
