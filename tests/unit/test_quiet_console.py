"""The warnings `far` drops from its console by default are harmless: Tunix's
"You might be missing jax[tpu]" only skips a TPU memory report on CPU, and the filter drops
that warning alone (-v keeps it). tests/integration/test_quiet_console.py runs the rest with
a real temporary Prefect server."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from flows.commands import console

HINT = "Skipping non-TPU device: cpu. You might be missing jax[tpu] dependency."


@pytest.fixture
def absl_filters() -> Iterator[logging.Logger]:
    absl = logging.getLogger("absl")
    before, level = list(absl.filters), absl.level
    yield absl
    absl.filters[:] = before
    absl.setLevel(level)


def test_tunix_memory_report_on_cpu_only_skips_the_report(
    caplog: pytest.LogCaptureFixture, absl_filters: logging.Logger
) -> None:
    from tunix.sft import utils

    absl_filters.filters[:] = []  # an earlier test's in-process `far` may have added FAR's filter
    with caplog.at_level(logging.WARNING, logger="absl"):
        assert utils.show_hbm_usage("FAR test") is None  # no error, nothing else done
    assert [r.getMessage() for r in caplog.records] == [HINT]


def test_the_cpu_hint_is_dropped_by_default_and_other_absl_warnings_kept(
    caplog: pytest.LogCaptureFixture, absl_filters: logging.Logger
) -> None:
    console.configure_logging(verbose=False)
    console.configure_logging(verbose=False)  # twice (tests, plugins): one filter
    assert sum(isinstance(f, console.DropHarmlessNotices) for f in absl_filters.filters) == 1
    with caplog.at_level(logging.WARNING, logger="absl"):
        absl_filters.warning("Skipping non-TPU device: %s. You might be missing jax[tpu]", "cpu")
        absl_filters.warning("Skipping non-TPU device: %s. You might be missing jax[tpu]", "gpu")
        absl_filters.warning("checkpoint %s not found", "/x")
    assert [r.getMessage() for r in caplog.records] == ["checkpoint /x not found"]


def test_verbose_keeps_the_cpu_hint(
    caplog: pytest.LogCaptureFixture, absl_filters: logging.Logger
) -> None:
    absl_filters.filters[:] = []
    console.configure_logging(verbose=True)
    with caplog.at_level(logging.WARNING, logger="absl"):
        absl_filters.warning(HINT)
    assert [r.getMessage() for r in caplog.records] == [HINT]
