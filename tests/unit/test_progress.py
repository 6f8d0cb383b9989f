"""Progress of a resumed training session counts the resumed offset once."""

from __future__ import annotations

from stages.core.progress import ProgressUpdate, reporting


def test_a_resumed_trainer_that_rereads_its_trained_batches_reports_each_step_once() -> None:
    """Tunix's SFT trainer resumed at step 150 of 200 (2 micro-batches a step) reads the
    first 300 micro-batches again and skips them, then trains 100 more."""
    seen: list[ProgressUpdate] = []
    stream = reporting(iter(range(400)), seen.append, "sft", 150, 200, items_per_step=2, skip=300)
    assert list(stream) == list(range(400))
    assert [u.step for u in seen] == list(range(151, 201))
    assert seen[-1].describe().startswith("sft 200/200 (100%)")
