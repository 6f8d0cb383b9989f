"""What ran a stage, recorded in every record for audit: FAR's and its packages' versions, the
git commit of the code, and the hardware. None of it moves a stage's hash.
"""

from __future__ import annotations

import functools
import json
import subprocess
from importlib import metadata
from pathlib import Path

from schemas.record import CodeVersion, Hardware

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
