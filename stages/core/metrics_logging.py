"""Training curves where users look: TensorBoard, MLflow, W&B, as the recipe's `logging:` asks.

Tunix's MetricsLogger, given no backends of its own, starts TensorBoard and also a W&B run
whenever the `wandb` package is importable (tunix 0.1.7 MetricsLoggerOptions.create_backends),
an unnamed, anonymous run nobody asked for. So FAR always hands Tunix its own list through the
public `backend_kwargs={"custom_backend": [factories]}`, built here from the recipe: only the
backends it names, never an empty list (Tunix reads an empty list as "use the defaults").

Each backend has the shape Tunix and jax.monitoring call: `log_scalar(event, value, step=)`
and `close()`. Tunix creates them on process 0 only. A backend is a jax.monitoring listener,
so it also hears JAX's own scalars (compile durations, without a step): those are dropped;
every metric Tunix or FAR logs carries its step. One MLflow run per stage directory
({node}-{hash}), found again by its tag when the stage continues in a later session; the
experiment is the run's name unless `logging.experiment` says otherwise. Nothing here is part
of a stage's identity: where curves are shown never changes what a stage computes.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import posixpath
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from schemas.recipe import LoggingConfig
from stages.core import sessions, storage
from stages.core.errors import InputError

MLFLOW_DIR = "mlflow"  # {run}/mlflow/mlflow.db: the default store (a folder, not a stage)
MLFLOW_DB = "mlflow.db"
STAGE_TAG = "far.stage_dir"  # the MLflow tag that finds a stage directory's run again
_MLFLOW_KEY = re.compile(r"[^A-Za-z0-9_\-. :/]")  # what MLflow refuses in a metric name
_EVENT_FILES = itertools.count()  # numbers this process's TensorBoard event files


class Backend(Protocol):
    """A metrics backend as Tunix's MetricsLogger and jax.monitoring call it."""

    def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None: ...

    def close(self) -> None: ...


class MissingBackendPackage(InputError):
    """The recipe turns on a backend whose package is not installed."""


def require_packages(config: LoggingConfig) -> None:
    """Refuse, before any compute, a backend the recipe turns on whose package is missing."""
    wanted = {"wandb": config.wandb, "mlflow": config.mlflow}
    for package, on in wanted.items():
        if on and importlib.util.find_spec(package) is None:
            hint = "pip install wandb" if package == "wandb" else "pip install mlflow-skinny"
            raise MissingBackendPackage(
                f"logging.{package} is true but the {package!r} package is not installed; "
                f"install it ({hint}) or set logging.{package}: false"
            )


def _step(kwargs: dict[str, Any]) -> int | None:
    """The training step of a metric; None for JAX's own stepless scalars (not a metric)."""
    step = kwargs.get("step")
    return None if step is None else int(step)


def _scalar(value: Any) -> float:
    return float(np.asarray(value))


class Silent:
    """No backend at all (every backend off): keeps Tunix from falling back to its defaults."""

    def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
        del event, value, kwargs

    def close(self) -> None:
        return None


class TensorBoard:
    """Event files under `log_dir`, written on the calling thread behind the stage's write fence.

    tensorboardX's SummaryWriter writes from its own thread, out of reach of the lease: a
    holder stopped past its lease (SIGSTOP) and continued would flush its queued events into
    a stage directory its successor committed. Here a record is only kept in memory until a
    flush, every `flush_secs` and at close; each flush first asks the stage's write fence
    (sessions.check_writes, LeaseLost once the session may no longer write the stage), then
    writes and flushes the records at once, so no byte waits in a buffer for a later flush
    (nor for the interpreter's exit). A full disk raises on the caller's thread (SaveFailed
    for the stage). A closed backend drops what it still hears (JAX keeps it as a listener).
    """

    def __init__(self, log_dir: str, flush_secs: float = 30.0) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.record_writer import RecordWriter, directory_check

        self._flush_secs = flush_secs
        self._pending: list[Any] = []  # Event protos not yet written
        self._oldest = 0.0  # time.monotonic() of the oldest pending record
        self._lock = threading.Lock()
        self._closed = False
        sessions.check_writes()  # the event file is a write into the stage directory
        directory_check(log_dir)
        # tensorboardX's name, made unique: two files begun in one second never clash
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self.path = posixpath.join(log_dir, f"{name}.{os.getpid()}.{next(_EVENT_FILES)}")
        self._file = RecordWriter(self.path)
        self._write([Event(wall_time=time.time(), file_version="brain.Event:2")])

    def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
        if (step := _step(kwargs)) is None:
            return
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        record = Event(summary=scalar(event.lstrip("/"), _scalar(value)), step=step)
        record.wall_time = time.time()
        with self._lock:
            if self._closed:
                return
            if not self._pending:
                self._oldest = time.monotonic()
            self._pending.append(record)
            if time.monotonic() - self._oldest >= self._flush_secs:
                self._write_pending()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._write_pending()
            finally:
                self._pending = []
                self._file.close()  # nothing left in its buffer: writes no byte

    def _write_pending(self) -> None:
        if not self._pending:
            return
        records, self._pending = self._pending, []  # on a lost lease they are dropped
        sessions.check_writes()
        self._write(records)

    def _write(self, records: list[Any]) -> None:
        """Append `records` and flush them to the OS, naming the file if storage refuses."""
        try:
            for record in records:
                self._file.write(record.SerializeToString())
            self._file.flush()
        except OSError as e:
            if e.filename is not None:
                raise
            raise OSError(e.errno, e.strerror, self.path) from e


class MLflow:
    """One MLflow run per stage directory, through MlflowClient (no global active run).

    Metrics are buffered and written one batch per step (and at close), so a remote tracking
    server sees one request per step rather than one per scalar."""

    def __init__(self, tracking_uri: str, experiment: str, run_name: str, tags: dict[str, str]):
        from mlflow.tracking import MlflowClient

        for name, bound in CLIENT_BOUNDS.items():
            os.environ.setdefault(name, bound)
        try:
            self._client = MlflowClient(tracking_uri=tracking_uri)
            self.run_id = _open_run(self._client, experiment, run_name, tags)
        except Exception as e:  # any store error (bad URI, file store refused, server down)
            raise InputError(
                f"logging.mlflow_tracking_uri: MLflow cannot write to {tracking_uri!r}: "
                f"{type(e).__name__}: {e}; expected a sqlite:/// path, a reachable server, or "
                f"no URI (the run's own {MLFLOW_DIR}/{MLFLOW_DB})"
            ) from e
        self._pending: list[Any] = []
        self._pending_step: int | None = None

    def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
        from mlflow.entities import Metric

        step = _step(kwargs)
        if step is None:
            return
        if self._pending_step is not None and step != self._pending_step:
            self.flush()
        key = _MLFLOW_KEY.sub("_", event.lstrip("/"))
        self._pending.append(Metric(key, _scalar(value), int(time.time() * 1000), step))
        self._pending_step = step

    def flush(self) -> None:
        if self._pending:
            self._client.log_batch(self.run_id, metrics=self._pending)
        self._pending, self._pending_step = [], None

    def close(self) -> None:
        self.flush()
        self._client.set_terminated(self.run_id)


def _open_run(client: Any, experiment: str, run_name: str, tags: dict[str, str]) -> str:
    """The id of the experiment's run tagged with this stage directory, reopened; else a new
    run (a stage that continues in a later session adds to the curves it started)."""
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    query = f"tags.`{STAGE_TAG}` = '{tags[STAGE_TAG]}'"
    runs = client.search_runs([experiment_id], filter_string=query, max_results=1)
    if runs:
        client.update_run(runs[0].info.run_id, status="RUNNING")
        return str(runs[0].info.run_id)
    return str(client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id)


class WandB:
    """A W&B run per stage directory (id = the directory's name, resumed on a continuation).

    `wandb` is optional and not installed with FAR: it is imported by name at run time, only
    when the recipe turns it on (require_packages refused a missing one before compute)."""

    def __init__(self, project: str, run_name: str, run_id: str) -> None:
        wandb = importlib.import_module("wandb")
        self._run = wandb.init(project=project, name=run_name, id=run_id, resume="allow")

    def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
        if (step := _step(kwargs)) is not None:
            self._run.log({event.lstrip("/"): _scalar(value)}, step=step)

    def close(self) -> None:
        self._run.finish()


@dataclass(frozen=True)
class MetricsSinks:
    """The backends one training stage directory writes its curves to."""

    config: LoggingConfig = field(default_factory=LoggingConfig)
    experiment: str = "far"  # the MLflow experiment and W&B project
    run_name: str = "stage"  # the node id
    stage_dir: str = ""  # {node}-{hash}: tags the MLflow run, names the W&B run id
    tracking_uri: str | None = None  # MLflow's, resolved (None when MLflow is off)

    def factories(self, log_dir: str) -> list[Callable[[], Backend]]:
        """A fresh-backend factory per backend the recipe turns on (TensorBoard into
        `log_dir`); never empty."""
        out: list[Callable[[], Backend]] = []
        if self.config.tensorboard:
            out.append(lambda: TensorBoard(log_dir))
        if self.config.mlflow and self.tracking_uri is not None:
            uri, tags = self.tracking_uri, {STAGE_TAG: self.stage_dir}
            out.append(lambda: MLflow(uri, self.experiment, self.run_name, tags))
        if self.config.wandb:
            out.append(lambda: WandB(self.experiment, self.run_name, self.stage_dir))
        return out or [Silent]

    def tunix_backends(self, log_dir: str) -> dict[str, Any]:
        """`backend_kwargs` for Tunix's MetricsLoggerOptions: these backends and no others."""
        return {"custom_backend": self.factories(log_dir)}

    def log_once(self, log_dir: str, step: int, metrics: dict[str, float]) -> None:
        """Stage-level numbers (throughput, compilations) beside the curves, at `step`."""
        backends = [make() for make in self.factories(log_dir)]
        try:
            for backend in backends:
                for name, value in metrics.items():
                    backend.log_scalar(name, value, step=step)
        finally:
            for backend in backends:
                backend.close()


def tracking_uri(config: LoggingConfig, run_uri: str) -> str | None:
    """MLflow's tracking URI: the recipe's (a plain path is a SQLite file), else a SQLite
    file under the run; None when MLflow is off."""
    if not config.mlflow:
        return None
    uri = config.mlflow_tracking_uri
    if uri is None:
        if storage.protocol(run_uri) != "file":
            raise InputError(
                f"logging.mlflow: the default store is a SQLite file under the run, which "
                f"needs a local run directory, got {run_uri!r}; set logging.mlflow_tracking_uri"
            )
        folder = os.path.join(storage.normalize(run_uri), MLFLOW_DIR)
        os.makedirs(folder, exist_ok=True)
        return f"sqlite:///{os.path.join(folder, MLFLOW_DB)}"
    if "://" in uri or uri == "databricks":
        return uri
    path = os.path.abspath(os.path.expanduser(uri))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return f"sqlite:///{path}"


TRACKING_CHECK_SECONDS = 5.0
"""How long `far validate` / `far run` wait for an MLflow server to answer before compute."""
# MLflow's own client retries a failing request 7 times with backoff and waits 120 s for each
# answer: minutes inside a stage, deaf to the session's deadline. A stage's client gets these
# bounds unless the user set MLflow's variables.
CLIENT_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


class UnusableTrackingUri(InputError):
    """logging.mlflow_tracking_uri names a server that does not answer or a path MLflow
    cannot write."""


def check_tracking_uri(config: LoggingConfig) -> None:
    """Before compute: an http(s) tracking URI answers one request within
    TRACKING_CHECK_SECONDS (any HTTP status: the server is there); a SQLite file or file
    store lies in a directory this user can write (or can create). Writes nothing."""
    uri = config.mlflow_tracking_uri
    if not config.mlflow or uri is None or uri == "databricks":
        return
    scheme, _, rest = uri.partition("://") if "://" in uri else ("", "", uri)
    if scheme in ("http", "https"):
        _check_server(uri)
    elif scheme == "sqlite":
        _check_directory(uri, os.path.dirname(rest[1:]) or ".")  # sqlite:///path: 3 slashes
    elif scheme == "file":
        _check_directory(uri, rest)
    elif not scheme:
        _check_directory(uri, os.path.dirname(os.path.abspath(os.path.expanduser(uri))))


def _check_server(uri: str) -> None:
    import httpx

    try:
        httpx.get(uri, timeout=TRACKING_CHECK_SECONDS)
    except httpx.HTTPError as e:
        raise UnusableTrackingUri(
            f"logging.mlflow_tracking_uri: the MLflow server {uri} did not answer within "
            f"{TRACKING_CHECK_SECONDS:g} s ({type(e).__name__}); start it, correct the URI, "
            f"or set logging.mlflow: false"
        ) from e


def _check_directory(uri: str, directory: str) -> None:
    """`directory` is a writable directory, or can be made under one (nothing is made)."""
    existing = os.path.abspath(directory)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        why = f"{existing} is a file, not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = f"the directory {existing} is not writable by this user"
    else:
        return
    raise UnusableTrackingUri(
        f"logging.mlflow_tracking_uri: MLflow cannot write {uri!r}: {why}; expected a path "
        f"in a directory this user can write"
    )


def for_stage(config: LoggingConfig, run: str, run_uri: str, directory: str) -> MetricsSinks:
    """The sinks of the stage directory `directory` ({run_uri}/{node}-{hash}) of run `run`."""
    require_packages(config)
    stage_dir = posixpath.basename(directory.rstrip("/"))
    return MetricsSinks(
        config=config,
        experiment=config.experiment or run,
        run_name=stage_dir.rsplit("-", 1)[0],
        stage_dir=stage_dir,
        tracking_uri=tracking_uri(config, run_uri),
    )


DEFAULT_SINKS = MetricsSinks()
"""TensorBoard only: for a trainer built outside a run (tests, notebooks)."""
