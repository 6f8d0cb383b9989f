"""The content-addressed stage directory, the commit record, and skip-if-complete.

Every stage entry point calls `run_stage`. It hashes what determines the stage's output (its
config, the fingerprints of its inputs, and a hand-bumped STAGE_VERSION), places the work in
{root}/{run}/{stage}-{hash12}/, and writes stage.json LAST, as the commit marker. If that
record already exists the work is skipped and the recorded output returned: the storage, not
an orchestrator's cache, decides, so a run continues on a new machine with a new Prefect.

What counts as "code" in the hash: only STAGE_VERSION, bumped when a change alters a stage's
outputs. Commits that do not (refactors, logging, docs) leave finished stages valid; the exact
commit and package versions are still recorded in every record for audit.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import SecretStr, ValidationError

from schemas.artifacts import Artifact, EvalReport, StageOutput
from schemas.recipe import LoggingConfig, MeshSpec, ModelSpec
from schemas.record import (
    ArtifactRef,
    CodeVersion,
    Evaluation,
    ExternalEvaluation,
    FileDigest,
    Hardware,
    SessionLog,
    StageRecord,
)
from stages.core import drift, ledger, storage
from stages.core.errors import MissingInput, TamperedStage
from stages.core.progress import ProgressCallback
from stages.core.sessions import LeaseLost, SaveFailed, StopFlag, fencing
from stages.core.shared import SharedBuilds

log = logging.getLogger(__name__)
T = TypeVar("T")
StageName = str  # a registered stage kind (stages/registry.py)
RECORD_NAME = "stage.json"
IDENTITY_NAME = "identity.json"  # written when a stage starts: what the directory is for
SESSIONS_DIR = "sessions"  # one json per session that stopped or failed before the commit
EVALUATIONS_DIR = "evaluations"  # write-once scores of this stage's checkpoint by evaluations
EVALUATIONS_INDEX = "evaluations.json"  # an evaluation's directory: {evaluation file: sha256}
# an evaluation's directory: its scores of checkpoints from other runs (ExternalEvaluation)
EXTERNAL_EVALUATIONS_DIR = "external_evaluations"
SOURCE_PREFIX = "source:"  # identity inputs that are external data, not upstream artifacts
_RECORDED_PACKAGES = (
    "google-tunix",
    "jax",
    "jaxlib",
    "flax",
    "qwix",
    "optax",
    "orbax-checkpoint",
    "grain",
    "pydantic",
    "fsspec",
    "gcsfs",
    "prefect",
)


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
        """The recipe's model; a stage entry point that needs one is run with it."""
        if self.model is None:
            raise ValueError("RunContext.model is not set: run the stage through run_node")
        return self.model

    def check_fence(self) -> None:
        if self.fence is not None:
            self.fence()

    @property
    def model_cache(self) -> str:
        return self.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "far")

    @property
    def run_uri(self) -> str:
        return storage.join(self.root, self.run)

    def directory_name(self, stage: str) -> str:
        """A stage's directories are {node id}-{hash}; the default pipeline's ids are kinds."""
        return self.node or stage

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.time()


@dataclass(frozen=True)
class StageOutcome(Generic[T]):
    output: T
    record_uri: str
    skipped: bool
    seconds: float


@dataclass(frozen=True)
class StageIdentity:
    """Everything that determines a stage's output; its digest names the stage directory."""

    stage: StageName
    version: int
    config: dict[str, Any]
    inputs: dict[str, str]  # upstream name -> fingerprint ("source:<label>" for data sources)
    input_uris: dict[str, str] | None = None  # upstream name -> artifact URI (not hashed)

    @property
    def digest(self) -> str:
        payload = {
            "stage": self.stage,
            "version": self.version,
            "config": self.config,
            "inputs": self.inputs,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def with_uris(identity: StageIdentity, **uris: str) -> StageIdentity:
    """The identity with its inputs' URIs attached (for lineage; URIs are not hashed)."""
    return dataclasses.replace(identity, input_uris=uris)


def stage_identity(
    stage: StageName,
    version: int,
    config: dict[str, Any],
    inputs: Mapping[str, str],
    *,
    model: ModelSpec | None = None,
    key: str | None = None,
    code: Mapping[str, str] | None = None,
) -> StageIdentity:
    """The identity of a stage that runs on upstream artifacts, built the one way every such
    stage builds it: its hashed config (registry.hashed_config) under `key` (default: the
    stage's name), then the recipe's `model` when the stage runs one; the fingerprints of its
    `inputs` by name, then the digests of the user `code` it runs (rewards.reward_sources)."""
    hashed = {key or stage: config}
    if model is not None:
        hashed["model"] = model.model_dump(mode="json")
    return StageIdentity(stage, version, hashed, {**inputs, **(code or {})})


def run_stage_on_artifacts(
    ctx: RunContext,
    identity: StageIdentity,
    artifacts: Mapping[str, Artifact],
    work: Callable[[str], tuple[T, dict[str, float], dict[str, list[float]]]],
    carry_over: tuple[str, ...] = (),
) -> StageOutcome[T]:
    """`run_stage` for a stage whose identity hashes the upstream `artifacts` by name: their
    URIs are recorded under the same names (for lineage), in the order given. An artifact the
    identity does not hash under its name, by its fingerprint, is refused: its output would
    not move when that input changes."""
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
    """The input `name` of a stage's `inputs`, refusing another contract (build_dag checked
    the edges; this guards callers that build `inputs` themselves)."""
    value = inputs.get(name)
    if not isinstance(value, expected):
        raise TypeError(
            f"input {name!r}: expected a {expected.__name__}, got {type(value).__name__}"
        )
    return value


def optional_input(inputs: Mapping[str, object], name: str, expected: type[A]) -> A | None:
    """The optional input `name`, or None when the node has no such input."""
    return require_input(inputs, name, expected) if name in inputs else None


def stage_directory(ctx: RunContext, stage: str, digest: str) -> str:
    return storage.join(ctx.run_uri, f"{ctx.directory_name(stage)}-{digest[:12]}")


def read_record(record_uri: str) -> StageRecord | None:
    if not storage.exists(record_uri):
        return None
    try:
        return StageRecord.model_validate(storage.read_json(record_uri))
    except (ValidationError, ValueError) as e:
        raise ValueError(f"stage record {record_uri} is unreadable or invalid: {e}") from e


def find_record(uri: str, levels: int = 4) -> tuple[str, StageRecord] | None:
    """The committed record of the stage that holds `uri`: in it or up to `levels`-1 above.

    Only where the layout puts records counts: stage.json directly in a stage directory named
    {node}-{hash12} after the record's own node and hash, and the outermost such directory (a
    stage directory never holds another, so a stage.json planted inside a checkpoint folder is
    ignored, as the audit ignores it).
    """
    candidate, found = storage.normalize(uri), None
    for _ in range(levels):
        name = candidate.rsplit("/", 1)[-1]
        if STAGE_DIRECTORY.match(name):
            record_uri = storage.join(candidate, RECORD_NAME)
            record = read_record(record_uri)
            if record is not None and in_layout(record_uri, record):
                found = (record_uri, record)
        candidate = candidate.rsplit("/", 1)[0]
    return found


STAGE_DIRECTORY = re.compile(r"^(?P<node>.+)-(?P<hash>[0-9a-f]{12})$")


def in_layout(record_uri: str, record: StageRecord) -> bool:
    """True when the record sits in the directory named after its node and stage hash."""
    match = STAGE_DIRECTORY.match(record_uri.rsplit("/", 2)[-2])
    return (
        match is not None
        and match["node"] == (record.node or record.stage)
        and record.stage_hash.startswith(match["hash"])
    )


def record_directory(record_uri: str) -> str:
    """A record's stage directory: where the record is, whatever path it stores (a copied or
    moved run keeps working)."""
    return record_uri.rsplit("/", 1)[0]


def record_run(record_uri: str) -> str:
    """The run a record belongs to, from where it is: {run}/{stage dir}/stage.json."""
    return record_directory(record_uri).rsplit("/", 1)[0]


def resolve(record_uri: str, record: StageRecord, path: str) -> str:
    """A path a record stores, as a URI in the record's run as it is now.

    Records store paths relative to their run; records written before did so with absolute
    URIs, which are mapped from the run the record was written in (its `directory`'s parent)
    to where the run is now.
    """
    run_uri = record_run(record_uri)
    if not _is_absolute(path):
        return storage.join(run_uri, path)
    original = record.directory.rsplit("/", 1)[0] if _is_absolute(record.directory) else None
    if original and path.startswith(original + "/"):
        return storage.join(run_uri, path[len(original) + 1 :])
    return path


def in_run(run_uri: str, uri: str) -> str:
    """`uri` relative to `run_uri` when inside it (as records store it), else unchanged."""
    base = storage.normalize(run_uri).rstrip("/") + "/"
    full = storage.normalize(uri)
    return full[len(base) :] if full.startswith(base) else uri


def located_output(record_uri: str, record: StageRecord) -> StageOutput:
    """The record's output with its paths in the run as it is now, so a copied or moved run
    reads its own files, never the original's (which may be gone, or differ).

    Records hold the absolute URIs their stage wrote; each path under the run the record was
    written in is mapped to where the run is now (a path into another run, such as a score's
    checkpoint given by URI, is kept). An output outside the record's run is refused: a
    record pointing outside its run is never followed (inside it, a pick stage's output is
    the chosen stage's checkpoint).
    """
    written_in = _written_in(record_uri, record)
    now = record_run(record_uri)

    def here(path: str) -> str:
        if not _is_absolute(path):
            return storage.join(now, path)
        path = storage.normalize(path)
        if path == written_in or path.startswith(written_in + "/"):
            return storage.join(now, path[len(written_in) + 1 :])
        return path

    output = record.output
    update: dict[str, Any] = {"uri": here(output.uri)}
    if isinstance(output, EvalReport):
        update["samples_uri"] = here(output.samples_uri)
        update["scores"] = [
            s
            if s.checkpoint_uri is None
            else s.model_copy(update={"checkpoint_uri": here(s.checkpoint_uri)})
            for s in output.scores
        ]
    located = output.model_copy(update=update)
    directory = record_directory(record_uri)
    for path in (update["uri"], update.get("samples_uri", directory)):
        if not path.startswith(now + "/"):  # a pick's output is another stage's, in the run
            raise TamperedStage(
                f"{record_uri}: its output {path} is outside its run {now}; a record pointing "
                f"outside its run is not followed (restore the record, or delete {directory} "
                f"to compute the stage again)"
            )
    return located


def _written_in(record_uri: str, record: StageRecord) -> str:
    """The run's URI when the record was written: its absolute `directory`'s parent (records
    from before relative paths), else the prefix of its output's URI before its own stage
    directory's name."""
    if _is_absolute(record.directory):
        return storage.normalize(record.directory).rsplit("/", 1)[0]
    name = "/" + record.directory.rsplit("/", 1)[-1] + "/"  # the directory it was written in
    uri = storage.normalize(record.output.uri) if _is_absolute(record.output.uri) else ""
    at = (uri + "/").find(name)
    if at >= 0:
        return uri[:at]
    run_at = uri.rfind(f"/{record.run}/")  # another stage's output in the run (a pick's)
    if run_at >= 0:
        return uri[: run_at + len(record.run) + 1]
    return record_run(record_uri)  # a relative output, or one outside: checked by the caller


def _is_absolute(path: str) -> bool:
    return path.startswith("/") or "://" in path


def find_checkpoint_record(uri: str) -> tuple[str, StageRecord]:
    """The record of the stage whose checkpoint is at `uri` (the uri or up to two levels up)."""
    uri = storage.normalize(uri)
    found = find_record(uri, levels=3)
    if found is not None:
        record_uri, record = found
        directory = record_uri.rsplit("/", 1)[0]
        output = located_output(record_uri, record)  # the record holds the URI it was written at
        if output.kind == "checkpoint" and uri in (output.uri, directory):
            return found
    raise MissingInput(
        f"no committed FAR checkpoint at {uri}: expected a stage record ({RECORD_NAME}) of an "
        f"sft or grpo stage in it or up to two directories above"
    )


def record_digest(record: StageRecord) -> str:
    """sha256 of a record's canonical JSON without its own `digest` field."""
    payload = record.model_dump(mode="json", exclude={"digest"})
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return storage.sha256_bytes(canonical.encode())


def commit_record(ctx: RunContext, record_uri: str, record: StageRecord) -> None:
    """Write a stage's record, sealed with its digest, once: the stage's commit marker; then
    chain it into the run's ledger. Refused (ctx.fence) once this session lost its lease."""
    ctx.check_fence()
    sealed = record.model_copy(update={"digest": record_digest(record)})
    storage.write_json(record_uri, sealed.model_dump(mode="json"))
    ledger.append(ctx.run_uri, record_uri, "record", ctx.audit_key)


def write_evaluation(checkpoint_record_uri: str, evaluation: Evaluation) -> tuple[str, str]:
    """Write an evaluation of a checkpoint beside its record, once; (its URI, its sha256).

    The file is named after the evaluation stage's directory. It is written before that
    stage commits, so a session that stopped after writing it meets it again: an identical
    file is kept, a different one is from an evaluation that never committed and is replaced.
    """
    directory = checkpoint_record_uri.rsplit("/", 1)[0]
    name = evaluation.evaluation.rstrip("/").rsplit("/", 1)[-1]
    uri = storage.join(directory, EVALUATIONS_DIR, f"{name}.json")
    data = (
        json.dumps(evaluation.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    ).encode()
    if not storage.create_exclusive(uri, data) and storage.read_bytes(uri) != data:
        log.warning("replacing %s, left by an evaluation session that did not commit", uri)
        storage.write_bytes(uri, data)
    return uri, storage.sha256_bytes(data)


def write_external_evaluation(
    directory: str, checkpoint_record_uri: str, evaluation: Evaluation
) -> str:
    """Keep an evaluation of another run's checkpoint in the evaluating stage's own
    `directory`, with the checkpoint's record URI, the sha256 of its bytes and the
    checkpoint's fingerprint (read now); the stage's record covers the file. Its URI."""
    data = storage.read_bytes(checkpoint_record_uri)
    record = StageRecord.model_validate(json.loads(data))
    external = ExternalEvaluation(
        **evaluation.model_dump(),
        checkpoint_record_uri=checkpoint_record_uri,
        checkpoint_record_digest=storage.sha256_bytes(data),
        checkpoint_fingerprint=record.output.fingerprint,
    )
    where = record_directory(checkpoint_record_uri)
    key = hashlib.sha256(where.encode()).hexdigest()[:12]  # two runs' directories share names
    name = f"{where.rsplit('/', 1)[-1]}-{key}.json"
    uri = storage.join(directory, EXTERNAL_EVALUATIONS_DIR, name)
    storage.write_json(uri, external.model_dump(mode="json"))
    return uri


def read_external_evaluations(stage_directory: str) -> list[tuple[str, ExternalEvaluation]]:
    """An evaluation stage's scores of other runs' checkpoints, oldest name first."""
    folder = storage.join(stage_directory, EXTERNAL_EVALUATIONS_DIR)
    return [
        (uri, ExternalEvaluation.model_validate(storage.read_json(uri)))
        for uri in (storage.join(folder, rel) for rel in sorted(storage.list_files(folder)))
    ]


def same_run(record_uri: str, run_uri: str) -> bool:
    """Whether the record at `record_uri` belongs to the run at `run_uri`."""
    return storage.normalize(record_run(record_uri)) == storage.normalize(run_uri)


def read_evaluations(stage_directory: str) -> list[tuple[str, Evaluation]]:
    """The evaluation files about a stage's checkpoint, oldest name first."""
    folder = storage.join(stage_directory, EVALUATIONS_DIR)
    return [
        (uri, Evaluation.model_validate(storage.read_json(uri)))
        for uri in (storage.join(folder, rel) for rel in sorted(storage.list_files(folder)))
    ]


@dataclass(frozen=True)
class Decision:
    """What a session does with a stage, decided from storage alone: the one decision that
    `run_stage` acts on and `far validate` shows (pipeline/plan.py), so the plan is the run's.

    skip: its record is committed and still matches its files (else TamperedStage is raised);
    continue: its directory was started before and resumes there, or (`previous` set) an
    allowed continuation setting carries the previous directory's checkpoints over; run: it
    starts from nothing. An unallowed change from the previous directory raises DriftError.
    """

    action: Literal["skip", "continue", "run"]
    directory: str
    detail: str
    record: StageRecord | None = None  # skip: the committed record
    previous: str | None = None  # the node's earlier directory this one is compared with
    changes: tuple[drift.Change, ...] = ()  # allowed changes from `previous`


class StageWouldRun(Exception):  # not an error: how plan mode hands back a decision
    """Raised by `run_stage` in plan mode (RunContext.plan_only) instead of doing the work."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(f"{decision.action}: {decision.detail}")
        self.decision = decision


def decide(ctx: RunContext, identity: StageIdentity, carry_over: tuple[str, ...] = ()) -> Decision:
    """Skip, continue or run `identity` in this run: reads records and identities only.

    Raises TamperedStage (a committed stage whose files no longer match its record) and
    DriftError (an unallowed change from the node's previous directory), as a run would.
    """
    directory = stage_directory(ctx, identity.stage, identity.digest)
    record_uri = storage.join(directory, RECORD_NAME)
    record = read_record(record_uri)
    if record is not None:
        verify_before_reuse(record_uri, record)
        return Decision("skip", directory, "complete", record)
    if storage.exists(storage.join(directory, IDENTITY_NAME)):
        return Decision("continue", directory, "started before, not committed: resumes it")
    node = ctx.directory_name(identity.stage)
    previous = previous_directory(ctx, node, directory)
    if previous is None:
        return Decision("run", directory, "not started")
    changes = identity_changes(storage.read_json(storage.join(previous, IDENTITY_NAME)), identity)
    sections = [key for key in identity.config if key != "model"]  # model: the recipe's
    drift.check(
        f"stage {identity.stage}", changes, drift.node_allowances(ctx.allow_changes, node, sections)
    )
    shown = "; ".join(str(c) for c in changes) or "an input changed"
    if carry_over and changes and drift.continuable(changes):
        detail = f"from {previous.rsplit('/', 1)[-1]}'s checkpoint in a new directory ({shown})"
        return Decision("continue", directory, detail, None, previous, tuple(changes))
    return Decision("run", directory, shown, None, previous, tuple(changes))


def run_stage(
    ctx: RunContext,
    identity: StageIdentity,
    work: Callable[[str], tuple[T, dict[str, float], dict[str, list[float]]]],
    carry_over: tuple[str, ...] = (),
) -> StageOutcome[T]:
    """Skip if committed, else run `work(directory)` and commit its output with a record.

    `work` returns the output, scalar metrics and per-step histories (training curves).
    `carry_over` names subdirectories (checkpoints) a continuable allowed change brings over
    from the run's previous directory of this stage (see stages/core/drift.py). In plan mode
    (ctx.plan_only) a stage that would not be skipped raises StageWouldRun with the decision.
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
        with fencing(functools.partial(_fence_stage, ctx, record_uri) if ctx.primary else None):
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


def previous_directory(ctx: RunContext, stage: str, exclude: str) -> str | None:
    """The run's most recently started directory of `stage` (a node id) other than `exclude`."""
    started = []
    for name in storage.list_dirs(ctx.run_uri):
        candidate = storage.join(ctx.run_uri, name)
        identity_uri = storage.join(candidate, IDENTITY_NAME)
        if name.startswith(f"{stage}-") and candidate != exclude and storage.exists(identity_uri):
            started.append((storage.read_json(identity_uri)["created_at"], candidate))
    return max(started)[1] if started else None


def identity_changes(old: dict[str, Any], new: StageIdentity) -> list[drift.Change]:
    """Config and code changes, plus source-data changes; upstream fingerprints are not drift."""
    changes = drift.diff(old["config"], new.config)
    if old["version"] != new.version:
        changes.append(drift.Change(f"code.{new.stage}_version", old["version"], new.version))
    old_sources, new_sources = _source_inputs(old["inputs"]), _source_inputs(new.inputs)
    code = drift.diff(_code(old_sources), _code(new_sources), "code.rewards")
    data = {k: v for k, v in old_sources.items() if not k.startswith(REWARD_SOURCE)}
    now = {k: v for k, v in new_sources.items() if not k.startswith(REWARD_SOURCE)}
    return changes + code + drift.diff(data, now, "data.source_content")


REWARD_SOURCE = "reward:"  # "source:reward:NAME:MODULE": a user's reward's source file digest


def _code(sources: dict[str, str]) -> dict[str, str]:
    """A user's rewards' source digests among the identity's sources, by reward name."""
    return {
        k.removeprefix(REWARD_SOURCE).split(":", 1)[0]: v
        for k, v in sources.items()
        if k.startswith(REWARD_SOURCE)
    }


def _source_inputs(inputs: dict[str, str]) -> dict[str, str]:
    """The identity's external sources, by label (upstream artifacts left out)."""
    return {
        k.removeprefix(SOURCE_PREFIX): v for k, v in inputs.items() if k.startswith(SOURCE_PREFIX)
    }


def input_refs(identity: StageIdentity, run_uri: str) -> dict[str, ArtifactRef]:
    """The record's view of the inputs: URI, fingerprint and (for artifacts) their record,
    whose path is stored relative to the run when it is in the run."""
    uris = identity.input_uris or {}
    refs = {}
    for name, fingerprint in identity.inputs.items():
        uri = uris.get(name, name.removeprefix(SOURCE_PREFIX))
        external = name.startswith(SOURCE_PREFIX)
        found = None if external else find_record(uri, levels=3)
        record_uri = None if found is None else found[0]
        digest = (
            None if record_uri is None else storage.sha256_bytes(storage.read_bytes(record_uri))
        )
        refs[name] = ArtifactRef(
            uri=uri,
            fingerprint=fingerprint,
            record_uri=None if record_uri is None else in_run(run_uri, record_uri),
            record_digest=digest,
        )
    return refs


def committed_files(directory: str) -> dict[str, tuple[int, str]]:
    """The files a stage's record covers: all in its directory but the record itself and the
    evaluation files other stages add later (each verified on its own)."""
    found = storage.file_digests(directory)  # a stage.json below the top is content, not a record
    return {
        rel: d
        for rel, d in found.items()
        if rel != RECORD_NAME and not rel.startswith(f"{EVALUATIONS_DIR}/")
    }


def verify_before_reuse(record_uri: str, record: StageRecord) -> None:
    """A complete stage is reused only if its record's seal and every file it lists still
    match; otherwise TamperedStage names what differs (the same checks as `far audit`)."""
    differs = (
        []
        if record.digest and record_digest(record) == record.digest
        else [f"{record_uri}: record unsealed or edited after its commit"]
    )
    differs += verify_files(record_uri, record)
    if differs:
        shown = "; ".join(differs[:5]) + (
            f"; and {len(differs) - 5} more" if len(differs) > 5 else ""
        )
        raise TamperedStage(
            f"stage {record.node or record.stage} is complete on storage but no longer matches "
            f"its record, so it is not reused: {shown}. Restore those files, or delete "
            f"{record_directory(record_uri)} to compute the stage again"
        )


def verify_files(record_uri: str, record: StageRecord) -> list[str]:
    """What differs between a stage directory and the files its record lists: missing,
    altered (size or content digest) and added files. Object-store checksums come from the
    listing (no download); local files are hashed again (sha256), which catches a same-size
    byte flip anywhere in a checkpoint."""
    directory = record_directory(record_uri)
    found = committed_files(directory)
    problems = []
    for rel, expected in sorted(record.files.items()):
        if rel not in found:
            problems.append(f"{directory}/{rel}: missing (recorded in {record_uri})")
            continue
        if _algorithm(found[rel][1]) != _algorithm(expected.digest):  # a record from before
            found[rel] = (found[rel][0], storage.sha256_file(f"{directory}/{rel}"))
        if found[rel] != (expected.size, expected.digest):
            problems.append(
                f"{directory}/{rel}: altered (size {found[rel][0]}, "
                f"recorded {expected.size}; content digest differs)"
            )
    for rel in sorted(set(found) - set(record.files)):
        problems.append(f"{directory}/{rel}: not in the record (added after commit)")
    return problems


def _algorithm(digest: str) -> str:
    return digest.split(":", 1)[0]


def directory_digests(directory: str) -> dict[str, FileDigest]:
    found = committed_files(directory)
    return {rel: FileDigest(size=size, digest=digest) for rel, (size, digest) in found.items()}


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


def code_version(stage_version: int) -> CodeVersion:
    packages = {}
    for name in _RECORDED_PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        far_version = metadata.version("far")
    except metadata.PackageNotFoundError:
        far_version = "unknown"
    return CodeVersion(
        far_version=far_version,
        stage_version=stage_version,
        git_commit=git_commit(),
        packages=packages,
    )


# Written at install or image build (`make env`, deploy/install.sh, deploy/Dockerfile) from
# `git rev-parse HEAD`, for installs without a .git directory (a Docker image, a wheel).
BUILD_INFO = Path(__file__).resolve().parent.parent / "_build_info.json"


@functools.cache
def git_commit() -> str | None:
    """The commit of the code running now: its checkout's HEAD (or the one baked in) when this
    process first asks, which a flow does at its start (its run tags). Read once: a checkout
    that moved during a long run (a pull, a commit) made later records name a commit whose
    code the process had not imported (docs/log.md, 2026-11-27)."""
    return _git_commit()


def _git_commit(repo: Path | None = None, build_info: Path = BUILD_INFO) -> str | None:
    """The checkout's HEAD; without git or .git, the commit baked in at install or build."""
    repo = repo or Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return baked_commit(build_info)
    return out.stdout.strip() or baked_commit(build_info)


def baked_commit(build_info: Path = BUILD_INFO) -> str | None:
    """The git commit recorded in `build_info` at install or image build, if any."""
    try:
        info = json.loads(build_info.read_text())
    except (OSError, ValueError):
        return None
    commit = info.get("git_commit") if isinstance(info, dict) else None
    return commit if isinstance(commit, str) and commit else None


def hardware() -> Hardware:
    import jax  # deferred: data_prep and record reading need no accelerator runtime

    device = jax.devices()[0]
    return Hardware(
        platform=device.platform,
        device_kind=device.device_kind,
        device_count=jax.device_count(),
        process_count=jax.process_count(),
    )
