"""Where a run's side effects go, never what it computes: the reward sandbox and the
metrics backends. Neither is part of any stage hash, and neither is drift.

Part of the recipe schema (schemas/recipe/__init__.py says how the package is laid out).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from schemas.base import Frozen
from schemas.recipe.common import PositiveInt


class SandboxConfig(Frozen):
    """Where rewards run model-written code and math (GRPO rewards, evaluation metrics).

    isolation `bwrap` (the default): bubblewrap namespaces, an unprivileged uid, read-only
    system files, no network, seccomp; the run is refused before it starts when this machine
    cannot give it. `process`: a plain child interpreter with seccomp and an audit hook, which
    code in that interpreter can switch off; accept it only for trusted models.
    Not part of any stage hash: the level changes where a verdict is computed, not a correct
    verdict.
    """

    isolation: Literal["bwrap", "process"] = "bwrap"
    """bwrap (namespaces + seccomp), or process (seccomp only: trusted models only)."""
    workers: PositiveInt | None = None
    """sandboxes at a time; None: one per CPU"""
    reward_call_seconds: Annotated[float, Field(gt=0, le=86400)] = 120.0
    """The most seconds one call of a user's reward (a plugin's, run in FAR's process) may
    take; past it the stage stops with exit 2 naming the reward. The session's deadline and a
    stop request (SIGTERM) end the wait earlier."""


class LoggingConfig(Frozen):
    """Where training stages (sft, grpo, dpo, distill) send their curves as they train: loss,
    learning rate, rewards, KL. FAR starts only the backends named here; Tunix's own default
    (a W&B run whenever `wandb` is importable) never runs. The stage record keeps its own
    history either way. Not part of any stage hash and not drift: where curves are shown
    never changes what a stage computes.
    """

    tensorboard: bool = True
    """TensorBoard event files in each training stage directory, {run}/{node}-{hash}/tensorboard/"""
    mlflow: bool = False
    """MLflow: one MLflow run per training stage directory, in the experiment below."""
    mlflow_tracking_uri: Annotated[str, Field(min_length=1)] | None = None
    """Where MLflow writes: a tracking URI (sqlite:///abs/path.db, http://host:5000) or a plain
    path to a SQLite file; None: {storage_root}/{name}/mlflow/mlflow.db (a local root only)."""
    wandb: bool = False
    """Weights & Biases; needs the `wandb` package, which FAR does not install."""
    experiment: Annotated[str, Field(min_length=1)] | None = None
    """The MLflow experiment and W&B project; None: the run's name. Runs are named by node."""

    @model_validator(mode="after")
    def _uri_needs_mlflow(self) -> LoggingConfig:
        if self.mlflow_tracking_uri is not None and not self.mlflow:
            raise ValueError(
                f"logging.mlflow_tracking_uri is {self.mlflow_tracking_uri!r} but logging.mlflow "
                f"is false, so nothing would be written there; set mlflow: true or drop the URI"
            )
        return self
