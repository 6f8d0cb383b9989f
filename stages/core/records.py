"""The stage directory's layout and its commit record (stage.json): reading, locating, sealing
and verifying it.

A record is written LAST, as the stage's commit marker, and sealed with its own digest; it
lists every file of its directory, so a reused stage is checked against what it committed.
Records store paths relative to their run, so a copied or moved run reads its own files.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from pydantic import ValidationError

from schemas.artifacts import EvalReport, StageOutput
from schemas.record import ArtifactRef, FileDigest, StageRecord
from stages.core import storage
from stages.core.errors import MissingInput, TamperedStage
from stages.core.identity import SOURCE_PREFIX, StageIdentity

log = logging.getLogger(__name__)

RECORD_NAME = "stage.json"

IDENTITY_NAME = "identity.json"  # written when a stage starts: what the directory is for

SESSIONS_DIR = "sessions"  # one json per session that stopped or failed before the commit

EVALUATIONS_DIR = "evaluations"  # write-once scores of this stage's checkpoint by evaluations

STAGE_DIRECTORY = re.compile(r"^(?P<node>.+)-(?P<hash>[0-9a-f]{12})$")


def read_record(record_uri: str) -> StageRecord | None:
    if not storage.exists(record_uri):
        return None
    try:
        return StageRecord.model_validate(storage.read_json(record_uri))
    except (ValidationError, ValueError) as e:
        raise ValueError(f"stage record {record_uri} is unreadable or invalid: {e}") from e


def find_record(uri: str, levels: int = 4) -> tuple[str, StageRecord] | None:
    """The committed record of the stage that holds `uri`: in it or up to `levels`-1 above.

    Only where the layout puts records counts: stage.json directly in a stage directory named
    {node}-{hash12} after the record's own node and hash, and the outermost such directory (a
    stage directory never holds another, so a stage.json planted inside a checkpoint folder is
    ignored, as the audit ignores it).
    """
    candidate, found = storage.normalize(uri), None
    for _ in range(levels):
        name = candidate.rsplit("/", 1)[-1]
        if STAGE_DIRECTORY.match(name):
            record_uri = storage.join(candidate, RECORD_NAME)
            record = read_record(record_uri)
            if record is not None and in_layout(record_uri, record):
                found = (record_uri, record)
        candidate = candidate.rsplit("/", 1)[0]
    return found


def in_layout(record_uri: str, record: StageRecord) -> bool:
    """True when the record sits in the directory named after its node and stage hash."""
    match = STAGE_DIRECTORY.match(record_uri.rsplit("/", 2)[-2])
    return (
        match is not None
        and match["node"] == (record.node or record.stage)
        and record.stage_hash.startswith(match["hash"])
    )


def record_directory(record_uri: str) -> str:
    """A record's stage directory: where the record is, whatever path it stores (a copied or
    moved run keeps working)."""
    return record_uri.rsplit("/", 1)[0]


def record_run(record_uri: str) -> str:
    """The run a record belongs to, from where it is: {run}/{stage dir}/stage.json."""
    return record_directory(record_uri).rsplit("/", 1)[0]


def resolve(record_uri: str, record: StageRecord, path: str) -> str:
    """A path a record stores, as a URI in the record's run as it is now.

    Records store paths relative to their run; records written before did so with absolute
    URIs, which are mapped from the run the record was written in (its `directory`'s parent)
    to where the run is now.
    """
    run_uri = record_run(record_uri)
    if not _is_absolute(path):
        return storage.join(run_uri, path)
    original = record.directory.rsplit("/", 1)[0] if _is_absolute(record.directory) else None
    if original and path.startswith(original + "/"):
        return storage.join(run_uri, path[len(original) + 1 :])
    return path


def in_run(run_uri: str, uri: str) -> str:
    """`uri` relative to `run_uri` when inside it (as records store it), else unchanged."""
    base = storage.normalize(run_uri).rstrip("/") + "/"
    full = storage.normalize(uri)
    return full[len(base) :] if full.startswith(base) else uri


def located_output(record_uri: str, record: StageRecord) -> StageOutput:
    """The record's output with its paths in the run as it is now, so a copied or moved run
    reads its own files, never the original's (which may be gone, or differ).

    Records hold the absolute URIs their stage wrote; each path under the run the record was
    written in is mapped to where the run is now (a path into another run, such as a score's
    checkpoint given by URI, is kept). An output outside the record's run is refused: a
    record pointing outside its run is never followed (inside it, a pick stage's output is
    the chosen stage's checkpoint).
    """
    written_in = _written_in(record_uri, record)
    now = record_run(record_uri)

    def here(path: str) -> str:
        if not _is_absolute(path):
            return storage.join(now, path)
        path = storage.normalize(path)
        if path == written_in or path.startswith(written_in + "/"):
            return storage.join(now, path[len(written_in) + 1 :])
        return path

    output = record.output
    update: dict[str, Any] = {"uri": here(output.uri)}
    if isinstance(output, EvalReport):
        update["samples_uri"] = here(output.samples_uri)
        update["scores"] = [
            s
            if s.checkpoint_uri is None
            else s.model_copy(update={"checkpoint_uri": here(s.checkpoint_uri)})
            for s in output.scores
        ]
    located = output.model_copy(update=update)
    directory = record_directory(record_uri)
    for path in (update["uri"], update.get("samples_uri", directory)):
        if not path.startswith(now + "/"):  # a pick's output is another stage's, in the run
            raise TamperedStage(
                f"{record_uri}: its output {path} is outside its run {now}; a record pointing "
                f"outside its run is not followed (restore the record, or delete {directory} "
                f"to compute the stage again)"
            )
    return located


def _written_in(record_uri: str, record: StageRecord) -> str:
    """The run's URI when the record was written: its absolute `directory`'s parent (records
    from before relative paths), else the prefix of its output's URI before its own stage
    directory's name."""
    if _is_absolute(record.directory):
        return storage.normalize(record.directory).rsplit("/", 1)[0]
    name = "/" + record.directory.rsplit("/", 1)[-1] + "/"  # the directory it was written in
    uri = storage.normalize(record.output.uri) if _is_absolute(record.output.uri) else ""
    at = (uri + "/").find(name)
    if at >= 0:
        return uri[:at]
    run_at = uri.rfind(f"/{record.run}/")  # another stage's output in the run (a pick's)
    if run_at >= 0:
        return uri[: run_at + len(record.run) + 1]
    return record_run(record_uri)  # a relative output, or one outside: checked by the caller


def _is_absolute(path: str) -> bool:
    return path.startswith("/") or "://" in path


def find_checkpoint_record(uri: str) -> tuple[str, StageRecord]:
    """The record of the stage whose checkpoint is at `uri` (the uri or up to two levels up)."""
    uri = storage.normalize(uri)
    found = find_record(uri, levels=3)
    if found is not None:
        record_uri, record = found
        directory = record_uri.rsplit("/", 1)[0]
        output = located_output(record_uri, record)  # the record holds the URI it was written at
        if output.kind == "checkpoint" and uri in (output.uri, directory):
            return found
    raise MissingInput(
        f"no committed FAR checkpoint at {uri}: expected a stage record ({RECORD_NAME}) of an "
        f"sft or grpo stage in it or up to two directories above"
    )


def record_digest(record: StageRecord) -> str:
    """sha256 of a record's canonical JSON without its own `digest` field."""
    payload = record.model_dump(mode="json", exclude={"digest"})
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return storage.sha256_bytes(canonical.encode())


def same_run(record_uri: str, run_uri: str) -> bool:
    """Whether the record at `record_uri` belongs to the run at `run_uri`."""
    return storage.normalize(record_run(record_uri)) == storage.normalize(run_uri)


def input_refs(identity: StageIdentity, run_uri: str) -> dict[str, ArtifactRef]:
    """The record's view of the inputs: URI, fingerprint and (for artifacts) their record,
    whose path is stored relative to the run when it is in the run."""
    uris = identity.input_uris or {}
    refs = {}
    for name, fingerprint in identity.inputs.items():
        uri = uris.get(name, name.removeprefix(SOURCE_PREFIX))
        external = name.startswith(SOURCE_PREFIX)
        found = None if external else find_record(uri, levels=3)
        record_uri = None if found is None else found[0]
        digest = (
            None if record_uri is None else storage.sha256_bytes(storage.read_bytes(record_uri))
        )
        refs[name] = ArtifactRef(
            uri=uri,
            fingerprint=fingerprint,
            record_uri=None if record_uri is None else in_run(run_uri, record_uri),
            record_digest=digest,
        )
    return refs


def committed_files(directory: str) -> dict[str, tuple[int, str]]:
    """The files a stage's record covers: all in its directory but the record itself and the
    evaluation files other stages add later (each verified on its own)."""
    found = storage.file_digests(directory)  # a stage.json below the top is content, not a record
    return {
        rel: d
        for rel, d in found.items()
        if rel != RECORD_NAME and not rel.startswith(f"{EVALUATIONS_DIR}/")
    }


def verify_before_reuse(record_uri: str, record: StageRecord) -> None:
    """A complete stage is reused only if its record's seal and every file it lists still
    match; otherwise TamperedStage names what differs (the same checks as `far audit`)."""
    differs = (
        []
        if record.digest and record_digest(record) == record.digest
        else [f"{record_uri}: record unsealed or edited after its commit"]
    )
    differs += verify_files(record_uri, record)
    if differs:
        shown = "; ".join(differs[:5]) + (
            f"; and {len(differs) - 5} more" if len(differs) > 5 else ""
        )
        raise TamperedStage(
            f"stage {record.node or record.stage} is complete on storage but no longer matches "
            f"its record, so it is not reused: {shown}. Restore those files, or delete "
            f"{record_directory(record_uri)} to compute the stage again"
        )


def verify_files(record_uri: str, record: StageRecord) -> list[str]:
    """What differs between a stage directory and the files its record lists: missing,
    altered (size or content digest) and added files. Object-store checksums come from the
    listing (no download); local files are hashed again (sha256), which catches a same-size
    byte flip anywhere in a checkpoint."""
    directory = record_directory(record_uri)
    found = committed_files(directory)
    problems = []
    for rel, expected in sorted(record.files.items()):
        if rel not in found:
            problems.append(f"{directory}/{rel}: missing (recorded in {record_uri})")
            continue
        if _algorithm(found[rel][1]) != _algorithm(expected.digest):  # a record from before
            found[rel] = (found[rel][0], storage.sha256_file(f"{directory}/{rel}"))
        if found[rel] != (expected.size, expected.digest):
            problems.append(
                f"{directory}/{rel}: altered (size {found[rel][0]}, "
                f"recorded {expected.size}; content digest differs)"
            )
    for rel in sorted(set(found) - set(record.files)):
        problems.append(f"{directory}/{rel}: not in the record (added after commit)")
    return problems


def _algorithm(digest: str) -> str:
    return digest.split(":", 1)[0]


def directory_digests(directory: str) -> dict[str, FileDigest]:
    found = committed_files(directory)
    return {rel: FileDigest(size=size, digest=digest) for rel, (size, digest) in found.items()}
