"""Which google-tunix versions FAR's Tunix workarounds were written and tested for.

tunix_compat.py touches Tunix internals; importing it runs `check_installed()`, which refuses
any other installed version with an error naming both. Setting FAR_ALLOW_UNTESTED_TUNIX=1
(what `far ... --allow-untested-tunix` does, with a logged warning) is the only way past it.
This module imports no Tunix, so the CLI can name the setting and the error cheaply.
"""

from __future__ import annotations

import logging
import os
from importlib import metadata

log = logging.getLogger(__name__)

TESTED_TUNIX_VERSIONS = ("0.1.7",)
ALLOW_UNTESTED_ENV = "FAR_ALLOW_UNTESTED_TUNIX"


class UntestedTunixError(RuntimeError):
    """The installed google-tunix is not one FAR's workarounds were written and tested for."""


def check_tunix_version(installed: str, allow_untested: bool) -> None:
    """Refuse an untested google-tunix unless explicitly allowed (then log it)."""
    if installed in TESTED_TUNIX_VERSIONS:
        return
    message = (
        f"google-tunix {installed} is installed, but FAR's Tunix workarounds were written and "
        f"tested for {', '.join(TESTED_TUNIX_VERSIONS)} (stages/modeling/tunix_compat.py)"
    )
    if not allow_untested:
        raise UntestedTunixError(
            f"{message}; install a tested version (requirements.lock) or pass "
            f"--allow-untested-tunix (or set {ALLOW_UNTESTED_ENV}=1) to run anyway"
        )
    log.warning("%s; running anyway because untested Tunix versions were allowed", message)


def check_installed() -> None:
    """Check the installed google-tunix against the tested versions (see the module docstring)."""
    check_tunix_version(metadata.version("google-tunix"), os.environ.get(ALLOW_UNTESTED_ENV) == "1")
