"""Evaluation that stops and resumes: finished batches of completions kept on storage.

An evaluation of several models over hundreds of prompts can outlast a session. Before each
batch it checks the session's stop flag (SIGTERM) and deadline (is there time for another
batch as long as the last one took?); each generated batch is written at once to
progress/<model key>/batch-<number>.json in the stage directory. The next session skips every
batch already on storage, so a stop costs at most the batch in flight. Each batch's sampling
seed depends only on its number, so a resumed evaluation equals an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import time

from stages.core import storage
from stages.core.runner import SessionExpired
from stages.core.sessions import StopFlag

PROGRESS_DIR = "progress"


class EvalProgress:
    """The finished batches of one model's completions, and when to stop generating more."""

    def __init__(
        self, directory: str, model: str, deadline: float | None, stop: StopFlag | None
    ) -> None:
        key = hashlib.sha256(model.encode()).hexdigest()[:16]
        self.folder = storage.join(directory, PROGRESS_DIR, key)
        self.model, self.deadline, self.stop = model, deadline, stop
        self.last_batch_seconds = 0.0
        self._started: float | None = None

    def _uri(self, number: int) -> str:
        return storage.join(self.folder, f"batch-{number:05d}.json")

    def load(self, number: int) -> list[str] | None:
        """The completions of batch `number` if a session finished it, else None."""
        uri = self._uri(number)
        if not storage.exists(uri):
            return None
        saved = storage.read_json(uri)
        if saved["model"] != self.model or saved["batch"] != number:
            raise ValueError(f"{uri} holds batch {saved['batch']} of {saved['model']!r}")
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

    def complete(self, batches: int) -> bool:
        """True when all `batches` batches are on storage (no model to restore at all)."""
        return all(storage.exists(self._uri(n)) for n in range(batches))
