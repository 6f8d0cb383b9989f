"""Evaluation that stops and resumes: finished batches of completions kept on storage.

An evaluation of several models over hundreds of prompts can outlast a session. Before each
batch it checks the session's stop flag (SIGTERM) and deadline (is there time for another
batch as long as the last one took?); each generated batch is written at once to
progress/<model key>/batch-<number>.json in the stage directory. The next session skips every
batch already on storage, so a stop costs at most the batch in flight. Each batch's sampling
seed depends only on its number, so a resumed evaluation equals an uninterrupted one.

`BatchTally` counts batches over all of an evaluation's models for the run's progress callback
(a bar or log line in the terminal, the Prefect UI), batches read back from storage included.
"""

from __future__ import annotations

import hashlib
import statistics
import time

from stages.core import storage
from stages.core.progress import Clock, ProgressCallback, ProgressUpdate, StepRate
from stages.core.runner import SessionExpired
from stages.core.sessions import StopFlag

PROGRESS_DIR = "progress"
BATCH_PREFIX, BATCH_SUFFIX = "batch-", ".json"  # progress/<model key>/batch-00012.json


def kept_batches(directory: str) -> int:
    """The batches of completions an evaluation's stage directory keeps, over all its models
    (a torn write's temporary file is not one)."""
    files = storage.list_files(storage.join(directory, PROGRESS_DIR))  # empty when absent
    names = (rel.rsplit("/", 1)[-1] for rel in files)
    return sum(name.startswith(BATCH_PREFIX) and name.endswith(BATCH_SUFFIX) for name in names)


class BatchTally:
    """Batches done over all rows of an evaluation, reported as its progress (batches read
    back count as done). s/step is the mean time of the generated batches after the first
    (which compiles; each later model's loading recurs, so it stays in), as StepRate keeps
    it; `clock` is passed in so a test drives it."""

    def __init__(
        self, callback: ProgressCallback | None, total: int, clock: Clock = time.perf_counter
    ) -> None:
        self.callback, self.total = callback, total
        self.done, self.generated = 0, 0
        self.rate = StepRate(clock, window=None, steady=statistics.fmean)

    def batch_done(self, generated: bool) -> None:
        self.done += 1
        self.generated += int(generated)
        if generated:
            self.rate.step()
        else:
            self.rate.restart()  # read back from storage: no time of a generated batch
        if self.callback is None:
            return
        update = ProgressUpdate("evaluate", self.done, self.total, self.rate.seconds_per_step)
        self.callback(update)


class EvalProgress:
    """The finished batches of one model's completions, and when to stop generating more."""

    def __init__(
        self,
        directory: str,
        model: str,
        deadline: float | None,
        stop: StopFlag | None,
        tally: BatchTally | None = None,
    ) -> None:
        key = hashlib.sha256(model.encode()).hexdigest()[:16]
        self.folder = storage.join(directory, PROGRESS_DIR, key)
        self.model, self.deadline, self.stop, self.tally = model, deadline, stop, tally
        self.last_batch_seconds = 0.0
        self._started: float | None = None

    def _uri(self, number: int) -> str:
        return storage.join(self.folder, f"{BATCH_PREFIX}{number:05d}{BATCH_SUFFIX}")

    def load(self, number: int) -> list[str] | None:
        """The completions of batch `number` if a session finished it, else None."""
        uri = self._uri(number)
        if not storage.exists(uri):
            return None
        saved = storage.read_json(uri)
        if saved["model"] != self.model or saved["batch"] != number:
            raise ValueError(f"{uri} holds batch {saved['batch']} of {saved['model']!r}")
        if self.tally is not None:
            self.tally.batch_done(generated=False)
        return [str(text) for text in saved["completions"]]

    def before_batch(self, number: int) -> None:
        """Stop (SessionExpired) on SIGTERM, or when the batch would not end by the deadline."""
        if self.stop is not None and self.stop.is_set():
            raise SessionExpired(
                f"{self.stop.reason}: evaluation of {self.model} stopped before batch {number}, "
                f"finished batches kept; it resumes from there"
            )
        if self.deadline is not None and time.time() + self.last_batch_seconds >= self.deadline:
            raise SessionExpired(
                f"session deadline: evaluation of {self.model} stopped before batch {number}, "
                f"finished batches kept; it resumes from there"
            )
        self._started = time.perf_counter()

    def save(self, number: int, completions: list[str]) -> None:
        payload = {"model": self.model, "batch": number, "completions": completions}
        storage.write_json(self._uri(number), payload)
        if self._started is not None:
            self.last_batch_seconds = time.perf_counter() - self._started
        if self.tally is not None:
            self.tally.batch_done(generated=True)

    def complete(self, batches: int) -> bool:
        """True when all `batches` batches are on storage (no model to restore at all)."""
        return all(storage.exists(self._uri(n)) for n in range(batches))
