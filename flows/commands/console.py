"""What `far` shows on the console and how: logging (plain lines, library noise dropped),
Prefect's settings and console handlers, and errors as one line with their exit code.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

from flows import prefect_server
from flows.commands.options import (
    EXIT_INVALID,
)
from pipeline.lease import LeaseHeld
from stages.core import storage
from stages.core.errors import InputError, is_input_error
from stages.core.sessions import LeaseLost, SaveFailed
from stages.modeling import tunix_version

EXIT_PREFECT = 1
# Prefect's temporary server (a new SQLite database, migrations, then the API) starts in about
# 11 s on an idle 2-core machine and took longer than Prefect's 20 s default on a busy one.
EPHEMERAL_STARTUP_SECONDS = 300
EPHEMERAL_TIMEOUT_TEXT = prefect_server.TIMEOUT_TEXT
STARTUP_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"  # far's temporary server too
PREFECT_DEFAULTS = {
    STARTUP_ENV: str(EPHEMERAL_STARTUP_SECONDS),
    # The temporary server's telemetry heartbeat writes to its new SQLite database while the
    # flow does and fails with "database is locked" (an ERROR and two tracebacks).
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # The client's usage telemetry, and its first-run notice on every new PREFECT_HOME
    # (FAR runs offline; set DO_NOT_TRACK=0 to keep Prefect's default).
    "DO_NOT_TRACK": "1",
    # A library's own thread (Tunix's GRPO learner reads its data, and so reports progress,
    # ahead in one) has no flow run context: its log lines still reach the console, and
    # Prefect's UserWarning that they cannot reach the API is one no user can act on.
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
}
FULL_DISK_TEXTS = ("No space left on device", "Disk quota exceeded")


def configure_logging(verbose: bool) -> None:
    """INFO lines on the console: their message alone, or with time and logger under -v."""
    plain = "%(message)s"
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s" if verbose else plain
    )
    quiet = logging.INFO if verbose else logging.WARNING
    for noisy in ("absl", "jax", "orbax", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(quiet)
    absl = logging.getLogger("absl")
    if not verbose and not any(isinstance(f, DropHarmlessNotices) for f in absl.filters):
        absl.addFilter(DropHarmlessNotices())
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "stages,pipeline")


def configure_prefect(environ: dict[str, str]) -> None:
    """Prefect settings `far` needs, unless the user set them; before Prefect is imported."""
    for key, value in PREFECT_DEFAULTS.items():
        environ.setdefault(key, value)


class DropHarmlessNotices(logging.Filter):
    """Drops library warnings a user cannot act on (shown with -v): Tunix's memory report,
    on each GRPO start, warns "Skipping non-TPU device: cpu. You might be missing jax[tpu]
    dependency." on a CPU or GPU, where it only skips reporting TPU memory."""

    TEXTS = ("Skipping non-TPU device:",)

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in self.TEXTS)


class HideInputErrorTracebacks(logging.Filter):
    """Drops the console lines (Prefect's, and the tracebacks of Orbax's failed background
    saves) about a run that ended on an error `far` prints once as one line: an input error, a
    lease held or lost, a write storage refused; the Prefect API and UI still get them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            return not is_one_line_error(record.exc_info[1])
        message = record.getMessage()  # "Finished in state Failed('... InputError: ...')"
        return not ("Failed(" in message and any(name in message for name in ONE_LINE_ERRORS))


INPUT_ERROR_NAMES = (
    "InputError",
    "MissingInput",
    "UnreachableInput",
    "RecipeError",
    "DriftError",
    "TamperedStage",
)
# errors `far` reports as one line with their own exit code; a full disk's text included
ONE_LINE_ERRORS = (*INPUT_ERROR_NAMES, "LeaseHeld", "LeaseLost", "SaveFailed", *FULL_DISK_TEXTS)


def is_one_line_error(error: BaseException) -> bool:
    """An error `far` prints as one line (input, lease, a refused write): no traceback."""
    if is_input_error(error) or storage.write_failure(error) is not None:
        return True
    return isinstance(error, LeaseHeld | LeaseLost | SaveFailed)


def quiet_prefect_console() -> None:
    """Attach HideInputErrorTracebacks to the console handlers Prefect's records reach (the
    root logger's and Prefect's own, as configured once Prefect is imported); never to its API
    handler, so the UI keeps the whole failure."""
    for name in (None, "prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            hidden = any(isinstance(f, HideInputErrorTracebacks) for f in handler.filters)
            if isinstance(handler, logging.StreamHandler) and not hidden:
                handler.addFilter(HideInputErrorTracebacks())


def report_input_error(error: BaseException, verbose: bool) -> int:
    """One line on stderr naming what to fix (the traceback too with -v); exit status 2."""
    if verbose:
        traceback.print_exception(error)
    print(f"far: {_input_error_of(error)}", file=sys.stderr)
    return EXIT_INVALID


def _input_error_of(error: BaseException) -> BaseException:
    current: BaseException | None = error
    while current is not None:
        if isinstance(current, InputError | tunix_version.UntestedTunixError):
            return current
        current = current.__cause__ or current.__context__
    return error


def report_prefect_start_failure(error: RuntimeError) -> int:
    seconds = os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")
    print(
        f"far: Prefect's temporary local server did not start within {seconds} s ({error}). "
        f"Nothing ran. Allow it longer with PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, "
        f"or start `prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api.",
        file=sys.stderr,
    )
    return EXIT_PREFECT
