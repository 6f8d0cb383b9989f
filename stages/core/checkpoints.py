"""The end of a training session, shared by every stage that trains with a Tunix trainer.

SFT, GRPO, DPO/ORPO and distillation all finish a session the same way: publish the local
Orbax checkpoints and logs to the stage's storage, stop with SessionExpired when the session
ended before `max_steps` (the next session resumes from the saved step), and otherwise describe
the committed checkpoint as a CheckpointArtifact fingerprinted by its content.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.artifacts import CheckpointArtifact
from schemas.recipe import LoraSpec, ModelSpec
from stages.core import storage
from stages.core.runner import NoProgress, SessionExpired


def publish_session(
    what: str,
    steps_done: int,
    max_steps: int,
    local_ckpt: str,
    ckpt_uri: str,
    local_logs: str,
    log_uri: str,
    start_step: int | None = None,
) -> None:
    """Publish checkpoints and logs (also when stopping); raise SessionExpired when short,
    NoProgress when this session (which began at `start_step`) took no step at all."""
    storage.publish_tree(local_ckpt, ckpt_uri)
    storage.publish_local_directory(local_logs, log_uri)  # curves so far, even when stopping
    if steps_done < max_steps and steps_done == start_step:
        raise NoProgress(
            f"{what} stopped at step {steps_done} of {max_steps} without taking a step in "
            f"this session: its time left did not cover one step plus the save margin"
        )
    if steps_done < max_steps:
        raise SessionExpired(
            f"{what} stopped at step {steps_done} of {max_steps} "
            f"with a checkpoint saved; it resumes from there"
        )


def committed_checkpoint(
    uri: str, step: int, model: ModelSpec, tokenizer: str, lora: LoraSpec | None
) -> CheckpointArtifact:
    """The CheckpointArtifact of the Orbax checkpoints under `uri`, by their content."""
    return CheckpointArtifact(
        uri=uri,
        step=step,
        model=model,
        tokenizer=tokenizer,
        lora=lora,
        size_bytes=sum(storage.list_files(uri).values()),
        fingerprint=storage.tree_fingerprint(uri),
    )


def saved_steps(uri: str) -> list[int]:
    """The steps saved under an Orbax checkpoint root: its numbered directories (a save still
    being written sits in a `<step>.orbax-checkpoint-tmp-*` directory and is not one)."""
    tops = {relative.split("/", 1)[0] for relative in storage.list_files(uri)}
    return sorted(int(top) for top in tops if top.isdigit())


def train_curve(metrics_logger: Any, name: str, prefix: str = "") -> list[float]:
    """The values of training metric `name` a Tunix MetricsLogger holds from this session;
    empty when the session took no step (a session resumed from its final checkpoint, after a
    crash before the record: Tunix's get_metric_history then fails with KeyError(''))."""
    if not metrics_logger.metric_exists(prefix, name, "train"):
        return []
    return [float(x) for x in np.asarray(metrics_logger.get_metric_history(prefix, name, "train"))]
