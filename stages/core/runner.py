"""Running a stage: skip-if-complete, the work, and the commit record. The stage-author API.

Every stage entry point calls `run_stage` (or `run_stage_on_artifacts`, for a stage whose
identity hashes its upstream artifacts). The stage's identity (stages/core/identity.py)
places the work in {root}/{run}/{stage}-{hash12}/, and stage.json is written LAST, as the
commit marker (stages/core/records.py). If that record already exists the work is skipped
and the recorded output returned: the storage, not an orchestrator's cache, decides
(stages/core/decisions.py), so a run continues on a new machine with a new Prefect.

`__all__` is the stage-author API: what a stage module imports from here. Each of its
functions documents its Args and Returns (tests/unit/test_stage_author_api.py checks it).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

from schemas.artifacts import Artifact
from schemas.record import SessionLog, StageRecord
from stages.core import ledger, sessions, storage
from stages.core.context import NoProgress, RunContext, SessionExpired
from stages.core.decisions import Decision, StageWouldRun, decide
from stages.core.identity import StageIdentity, stage_identity, with_uris
from stages.core.provenance import code_version, hardware
from stages.core.records import (
    IDENTITY_NAME,
    RECORD_NAME,
    SESSIONS_DIR,
    directory_digests,
    in_run,
    input_refs,
    located_output,
    read_record,
    record_digest,
    record_directory,
)
from stages.core.sessions import LeaseLost, SaveFailed, fencing

__all__ = [
    "NoProgress",
    "RunContext",
    "SessionExpired",
    "StageIdentity",
    "StageOutcome",
    "StageWouldRun",
    "optional_input",
    "require_input",
    "run_stage",
    "run_stage_on_artifacts",
    "stage_identity",
    "with_uris",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class StageOutcome(Generic[T]):
    """What `run_stage` hands back: the stage's output and where its record is."""

    output: T
    record_uri: str
    skipped: bool
    seconds: float


def run_stage_on_artifacts(
    ctx: RunContext,
    identity: StageIdentity,
    artifacts: Mapping[str, Artifact],
    work: Callable[[str], tuple[T, dict[str, float], dict[str, list[float]]]],
    carry_over: tuple[str, ...] = (),
) -> StageOutcome[T]:
    """`run_stage` for a stage whose identity hashes the upstream `artifacts` by name.

    Their URIs are recorded under the same names (for lineage), in the order given. An
    artifact the identity does not hash under its name, by its fingerprint, is refused: its
    output would not move when that input changes.

    Args:
        ctx: the run this stage belongs to.
        identity: the stage's identity (`stage_identity`), hashing each artifact's
            fingerprint under its input name.
        artifacts: the upstream artifacts by input name.
        work: called with the stage directory; returns the output, scalar metrics and
            per-step histories.
        carry_over: subdirectories a continuable allowed change brings over (`run_stage`).

    Returns:
        The stage's outcome: its output (computed now, or the recorded one when skipped) and
        its record's URI.

    Raises:
        ValueError: an artifact's fingerprint is not hashed under its name.
    """
    for name, artifact in artifacts.items():
        hashed = identity.inputs.get(name)
        if hashed != artifact.fingerprint:
            raise ValueError(
                f"stage {identity.stage}: input {name!r} ({artifact.uri}) has fingerprint "
                f"{artifact.fingerprint[:12]}, but the stage's identity hashes "
                f"{str(hashed)[:12]} under that name; expected its identity built from it"
            )
    uris = {name: artifact.uri for name, artifact in artifacts.items()}
    return run_stage(ctx, with_uris(identity, **uris), work, carry_over=carry_over)


A = TypeVar("A")


def require_input(inputs: Mapping[str, object], name: str, expected: type[A]) -> A:
    """The input `name` of a stage's `inputs`, refusing another contract.

    build_dag checked the edges; this guards callers that build `inputs` themselves.

    Args:
        inputs: the upstream artifacts by input name, as a stage's `run` receives them.
        name: the input (port) name.
        expected: the artifact contract the input must be (e.g. DatasetArtifact).

    Returns:
        The input, typed as `expected`.

    Raises:
        TypeError: the input is missing or is another contract.
    """
    value = inputs.get(name)
    if not isinstance(value, expected):
        raise TypeError(
            f"input {name!r}: expected a {expected.__name__}, got {type(value).__name__}"
        )
    return value


def optional_input(inputs: Mapping[str, object], name: str, expected: type[A]) -> A | None:
    """The optional input `name`, refusing another contract when it is there.

    Args:
        inputs: the upstream artifacts by input name, as a stage's `run` receives them.
        name: the input (port) name.
        expected: the artifact contract the input must be when given.

    Returns:
        The input typed as `expected`, or None when the node has no such input.
    """
    return require_input(inputs, name, expected) if name in inputs else None


def commit_record(ctx: RunContext, record_uri: str, record: StageRecord) -> None:
    """Write a stage's record, sealed with its digest, once: the stage's commit marker; then
    chain it into the run's ledger. Refused (ctx.fence) once this session lost its lease."""
    ctx.check_fence()
    sealed = record.model_copy(update={"digest": record_digest(record)})
    storage.write_json(record_uri, sealed.model_dump(mode="json"))
    ledger.append(ctx.run_uri, record_uri, "record", ctx.audit_key)


def run_stage(
    ctx: RunContext,
    identity: StageIdentity,
    work: Callable[[str], tuple[T, dict[str, float], dict[str, list[float]]]],
    carry_over: tuple[str, ...] = (),
) -> StageOutcome[T]:
    """Skip if committed, else run `work(directory)` and commit its output with a record.

    Args:
        ctx: the run this stage belongs to (in plan mode, ctx.plan_only, nothing is run).
        identity: the stage's identity; its digest names the stage directory.
        work: called with the stage directory; returns the output, scalar metrics and
            per-step histories (training curves).
        carry_over: subdirectories (checkpoints) a continuable allowed change brings over
            from the run's previous directory of this stage (see stages/core/drift.py).

    Returns:
        The stage's outcome: its output (the recorded one when skipped), its record's URI,
        whether it was skipped, and the seconds this session spent on it.

    Raises:
        StageWouldRun: in plan mode, a stage that would not be skipped, with the decision.
        SessionExpired: the session ended before the stage could start (NoProgress) or
            while it worked.
    """
    stage = identity.stage
    decision = decide(ctx, identity, carry_over)
    directory = decision.directory
    record_uri = storage.join(directory, RECORD_NAME)
    if decision.record is not None:
        log.info("stage %s: skipped, already complete (record %s)", stage, record_uri)
        located = located_output(record_uri, decision.record)
        return StageOutcome(located, record_uri, skipped=True, seconds=0.0)  # type: ignore[arg-type]
    if ctx.plan_only:
        raise StageWouldRun(decision)
    left = ctx.seconds_left()
    if left is not None and left <= 0:
        raise NoProgress(f"session deadline passed before stage {stage} could start")
    if ctx.stop is not None and ctx.stop.is_set():
        ctx.stop.raise_if_aborted()
        raise SessionExpired(f"{ctx.stop.reason} before stage {stage} could start")
    if ctx.primary:
        _start_directory(ctx, identity, decision, carry_over)
    log.info("stage %s: running in %s", stage, directory)
    started, t0 = datetime.now(UTC), time.perf_counter()
    try:
        with _fenced_stage(ctx, record_uri, directory):
            output, metrics, history = work(directory)
    except BaseException as e:
        outcome = "stopped" if isinstance(e, SessionExpired | KeyboardInterrupt) else "failed"
        if not ctx.primary or isinstance(e, LeaseLost):  # a lost lease: write nothing more
            raise
        try:
            _log_session(ctx, directory, started, t0, outcome, f"{type(e).__name__}: {e}")
        except Exception as note_error:  # the original error matters more than the note
            log.warning("stage %s: could not note the %s session: %s", stage, outcome, note_error)
        failed = save_failure(stage, directory, e)
        if failed is not None and failed is not e:
            raise failed from e
        raise
    if not ctx.primary:
        return _await_commit(ctx, record_uri, output)
    _fence_stage(ctx, record_uri)  # a session that lost its lease stops here, writing nothing
    this_session = _session(ctx, started, t0, "complete", "")
    record = StageRecord(
        stage=stage,
        run=ctx.run,
        status="complete",
        stage_hash=identity.digest,
        directory=in_run(ctx.run_uri, directory),
        config=identity.config,
        inputs=identity.inputs,
        output=output,
        code=code_version(identity.version),
        hardware=hardware(),
        started_at=started,
        finished_at=this_session.finished_at,
        seconds=this_session.seconds,
        metrics=metrics,
        history=history,
        flow_run_id=ctx.flow_run_id,
        input_artifacts=input_refs(identity, ctx.run_uri),
        sessions=[*_earlier_sessions(directory), this_session],
        files=directory_digests(directory),
        node=ctx.node if ctx.node != stage else None,
    )
    commit_record(ctx, record_uri, record)
    log.info("stage %s: complete in %.1f s -> %s", stage, this_session.seconds, record_uri)
    return StageOutcome(output, record_uri, skipped=False, seconds=this_session.seconds)


@contextlib.contextmanager
def _fenced_stage(ctx: RunContext, record_uri: str, directory: str) -> Iterator[None]:
    """The stage's write fence around its work (a primary session's only): before each
    checkpoint a library writes (sessions.fencing) and each write or delete through storage
    under the stage directory (storage.guarding; checked at most once a second, and again
    after any stop longer than that)."""
    if not ctx.primary:
        yield
        return
    with (
        fencing(functools.partial(_fence_stage, ctx, record_uri)),
        storage.guarding(directory, functools.partial(sessions.check_writes, within=1.0)),
    ):
        yield


def _fence_stage(ctx: RunContext, record_uri: str) -> None:
    """The fence before each write into a stage directory (a checkpoint, the commit): the
    session must still hold the run's lease (ctx.fence renews it), and no other session may
    have committed the directory meanwhile (a holder stopped past its lease's lifetime, whose
    successor finished the stage). Raises LeaseLost: the session writes nothing more."""
    ctx.check_fence()
    if storage.exists(record_uri):
        raise LeaseLost(
            f"stage directory {record_directory(record_uri)} was committed by another session "
            f"while this one worked on it; this session writes nothing more there"
        )


def save_failure(stage: str, directory: str, error: BaseException) -> SaveFailed | None:
    """The SaveFailed that ends a stage whose write storage refused (a full disk), naming the
    stage, its directory, the file and the cause; None for any other error."""
    cause = storage.write_failure(error)
    if cause is None:
        return error if isinstance(error, SaveFailed) else None
    return SaveFailed(
        f"stage {stage} could not save in {directory}: {cause}; everything committed before "
        f"is kept: make room, then run the same command again to continue"
    )


def _await_commit(ctx: RunContext, record_uri: str, output: T) -> StageOutcome[T]:
    """A non-primary process: wait for process 0 to commit the stage it worked on too."""
    give_up = time.monotonic() + ctx.commit_wait_seconds
    while (record := read_record(record_uri)) is None:
        if time.monotonic() > give_up:
            raise TimeoutError(
                f"process 0 did not commit {record_uri} within {ctx.commit_wait_seconds:.0f} s "
                f"of this process finishing the stage"
            )
        time.sleep(1.0)
    return StageOutcome(output, record_uri, skipped=False, seconds=record.seconds)


def is_primary_process() -> bool:
    """True in JAX process 0 (and in any single-process run): the one process that writes
    records, manifests, leases and UI artifacts."""
    import jax  # deferred: record reading needs no accelerator runtime

    return bool(jax.process_index() == 0)


def _start_directory(
    ctx: RunContext, identity: StageIdentity, decision: Decision, carry_over: tuple[str, ...]
) -> None:
    """Mark the directory's identity (the drift guard passed in `decide`), bringing over the
    previous directory's checkpoints when `decision` continues from them."""
    directory = decision.directory
    identity_uri = storage.join(directory, IDENTITY_NAME)
    if storage.exists(identity_uri):
        return  # this very directory was started before: a resume, not a change
    ctx.check_fence()
    if decision.action == "continue" and decision.previous is not None:
        for sub in carry_over:
            log.info("stage %s: continuing from %s/%s", identity.stage, decision.previous, sub)
            storage.copy_tree(storage.join(decision.previous, sub), storage.join(directory, sub))
    payload = {
        "stage": identity.stage,
        "node": ctx.directory_name(identity.stage),
        "version": identity.version,
        "config": identity.config,
        "inputs": identity.inputs,
        "input_uris": identity.input_uris or {},
        "created_at": datetime.now(UTC).isoformat(),
    }
    storage.write_json(identity_uri, payload)


def _session(
    ctx: RunContext, started: datetime, t0: float, outcome: str, detail: str
) -> SessionLog:
    return SessionLog.model_validate(
        {
            "flow_run_id": ctx.flow_run_id,
            "started_at": started,
            "finished_at": datetime.now(UTC),
            "seconds": time.perf_counter() - t0,
            "outcome": outcome,
            "detail": detail[:500],
        }
    )


def _log_session(
    ctx: RunContext, directory: str, started: datetime, t0: float, outcome: str, detail: str
) -> None:
    """Leave a note of a session that ended without committing (read back into the record)."""
    ctx.check_fence()
    entry = _session(ctx, started, t0, outcome, detail)
    name = f"{started.strftime('%Y%m%dT%H%M%S%f')}.json"
    storage.write_json(storage.join(directory, SESSIONS_DIR, name), entry.model_dump(mode="json"))


def _earlier_sessions(directory: str) -> list[SessionLog]:
    folder = storage.join(directory, SESSIONS_DIR)
    return [
        SessionLog.model_validate(storage.read_json(storage.join(folder, name)))
        for name in sorted(storage.list_files(folder))
    ]
