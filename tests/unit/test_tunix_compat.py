"""The Tunix compat module: its version guard, and the defects its workarounds exist for.

The GRPO resume workarounds are shown failing without their fix in
tests/integration/test_grpo_full.py and test_grpo_sessions.py (they need a trained model).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from tunix.sft import metrics_logger

from stages.modeling import tunix_compat, tunix_version

REPO = Path(__file__).resolve().parents[2]
# Import tunix_compat in a fresh interpreter that sees google-tunix 9.9.9 installed.
IMPORT_WITH_FAKE_VERSION = """
import importlib.metadata as md
real = md.version
md.version = lambda name: "9.9.9" if name == "google-tunix" else real(name)
import stages.modeling.tunix_compat
print("imported")
"""


def _import_with_fake_version(allow: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != tunix_version.ALLOW_UNTESTED_ENV}
    if allow:
        env[tunix_version.ALLOW_UNTESTED_ENV] = "1"
    return subprocess.run(
        [sys.executable, "-c", IMPORT_WITH_FAKE_VERSION],
        cwd=REPO,
        env=env | {"JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_untested_tunix_is_refused_at_import_naming_both_versions() -> None:
    refused = _import_with_fake_version(allow=False)
    assert refused.returncode != 0 and "imported" not in refused.stdout
    assert "UntestedTunixError: google-tunix 9.9.9 is installed" in refused.stderr
    assert "tested for 0.1.7" in refused.stderr and "--allow-untested-tunix" in refused.stderr


def test_an_untested_tunix_passes_only_when_allowed_and_is_logged() -> None:
    allowed = _import_with_fake_version(allow=True)
    assert allowed.returncode == 0 and "imported" in allowed.stdout, allowed.stderr
    assert "google-tunix 9.9.9 is installed" in allowed.stderr  # the warning


def test_the_tested_version_passes_silently(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        tunix_version.check_tunix_version(tunix_version.TESTED_TUNIX_VERSIONS[0], False)
    assert caplog.records == []


def test_cli_flag_sets_the_setting_the_guard_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from flows import cli

    monkeypatch.delenv(tunix_version.ALLOW_UNTESTED_ENV, raising=False)
    assert cli.main(["resume", "memory://no-such-run", "--allow-untested-tunix"]) == 2
    assert os.environ[tunix_version.ALLOW_UNTESTED_ENV] == "1"


def _sizes(directory: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for p in directory.rglob("*") if p.is_file()}


def test_closed_metrics_logger_keeps_listening_until_released(tmp_path: Path) -> None:
    """The JAX 0.10.2 defect release_scalar_listeners works around: a closed Tunix
    MetricsLogger's TensorBoard backend still receives scalars and touches its directory."""
    options = metrics_logger.MetricsLoggerOptions(log_dir=str(tmp_path), flush_every_n_steps=1)
    logger = metrics_logger.MetricsLogger(options)
    logger.log("train", "loss", 1.0, "train", step=1)
    logger.close()
    closed = _sizes(tmp_path)
    for step in range(3):
        jax.monitoring.record_scalar("/far/test/probe", 1.0, step=10 + step)
    assert _sizes(tmp_path) != closed  # the defect: the closed stage's directory changed
    assert tunix_compat.release_scalar_listeners(logger) == 1
    released = _sizes(tmp_path)
    for step in range(3):
        jax.monitoring.record_scalar("/far/test/probe", 1.0, step=20 + step)
    assert _sizes(tmp_path) == released
    assert tunix_compat.release_scalar_listeners(logger) == 0  # nothing left to release
