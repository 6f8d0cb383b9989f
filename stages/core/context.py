"""Where a run lives and when its session ends: the RunContext every stage is handed, and the
exceptions a stage raises when its session is over.

Kept apart from the runner so the modules that read records and decide what a session does
(records, decisions) take a context without importing the code that runs a stage.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import SecretStr

from schemas.recipe import LoggingConfig, MeshSpec, ModelSpec
from stages.core import storage
from stages.core.progress import ProgressCallback
from stages.core.sessions import StopFlag
from stages.core.shared import SharedBuilds


class SessionExpired(RuntimeError):
    """The run's deadline has passed: stop cleanly; the same command continues next session."""


class NoProgress(SessionExpired):
    """The session ended before the stage took a single step: running it again with the same
    budget would stop at the same point (`far` exits with its own code for a scheduler)."""


@dataclass(frozen=True)
class RunContext:
    """Where a run lives and when its session ends. Built once by the caller, passed down."""

    root: str
    run: str
    deadline: float | None = None  # time.time() after which no new work starts
    flow_run_id: str | None = None
    cache_dir: str | None = None  # converted model weights; None: ~/.cache/far
    stop: StopFlag | None = None  # set on SIGTERM: training stages save and stop
    allow_changes: tuple[str, ...] = ()  # drift the user accepted (dotted recipe paths)
    sandbox_isolation: Literal["bwrap", "process"] = "bwrap"  # for rewards that run code
    sandbox_workers: int | None = None  # sandboxes at a time; None: one per CPU
    reward_call_seconds: float = 120.0  # the most one call of a user's reward may take
    # process 0 of the run's JAX processes (multi-host): only it writes records, identity
    # and session notes; every process runs the work (Orbax saves are collective)
    primary: bool = True
    commit_wait_seconds: float = 600.0  # how long other processes wait for process 0's record
    progress: ProgressCallback | None = None  # per-step progress of training and evaluation
    node: str | None = None  # the pipeline node being run: names its directory (else the stage)
    # base networks and tokenizers built once for the whole run (None: each stage builds its own)
    shared: SharedBuilds | None = None
    audit_key: SecretStr | None = None  # signs the run's ledger (FAR_AUDIT_KEY, read by the CLI)
    # raises when this session no longer holds the run's lease: called before every commit
    fence: Callable[[], None] | None = None
    # `far validate`: run_stage decides as a run would and raises StageWouldRun instead of working
    plan_only: bool = False
    # the recipe's model and mesh, set by the node runner (pipeline/nodes.py) for a stage's run
    model: ModelSpec | None = None
    mesh: MeshSpec = field(default_factory=MeshSpec)
    # the recipe's logging: section (which metrics backends training stages start), ditto
    metrics_logging: LoggingConfig = field(default_factory=LoggingConfig)

    def require_model(self) -> ModelSpec:
        """The recipe's model; a stage entry point that needs one is run with it.

        Returns:
            The recipe's model spec.

        Raises:
            ValueError: the context was built without one (not through run_node).
        """
        if self.model is None:
            raise ValueError("RunContext.model is not set: run the stage through run_node")
        return self.model

    def check_fence(self) -> None:
        """Raise when this session no longer holds the run's lease (no-op without a fence).

        Returns:
            None; the fence raises sessions.LeaseLost when the lease is lost.
        """
        if self.fence is not None:
            self.fence()

    @property
    def model_cache(self) -> str:
        return self.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "far")

    @property
    def run_uri(self) -> str:
        return storage.join(self.root, self.run)

    def directory_name(self, stage: str) -> str:
        """The name a stage's directories start with: {node id}-{hash}.

        Args:
            stage: the stage kind, used when no node is set (the default pipeline's ids are
                kinds).

        Returns:
            The node id being run, else `stage`.
        """
        return self.node or stage

    def seconds_left(self) -> float | None:
        """The seconds until the session's deadline.

        Returns:
            The seconds left (negative once passed), or None when the run has no deadline.
        """
        return None if self.deadline is None else self.deadline - time.time()
