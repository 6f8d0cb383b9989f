"""Evaluations of a checkpoint, written after its stage committed: write-once files beside its
record (a committed record is immutable), or in the evaluating stage's own directory when the
checkpoint belongs to another run.
"""

from __future__ import annotations

import hashlib
import json
import logging

from schemas.record import Evaluation, ExternalEvaluation, StageRecord
from stages.core import storage
from stages.core.records import EVALUATIONS_DIR, record_directory

log = logging.getLogger(__name__)

EVALUATIONS_INDEX = "evaluations.json"  # an evaluation's directory: {evaluation file: sha256}

# an evaluation's directory: its scores of checkpoints from other runs (ExternalEvaluation)
EXTERNAL_EVALUATIONS_DIR = "external_evaluations"


def write_evaluation(checkpoint_record_uri: str, evaluation: Evaluation) -> tuple[str, str]:
    """Write an evaluation of a checkpoint beside its record, once; (its URI, its sha256).

    The file is named after the evaluation stage's directory. It is written before that
    stage commits, so a session that stopped after writing it meets it again: an identical
    file is kept, a different one is from an evaluation that never committed and is replaced.
    """
    directory = checkpoint_record_uri.rsplit("/", 1)[0]
    name = evaluation.evaluation.rstrip("/").rsplit("/", 1)[-1]
    uri = storage.join(directory, EVALUATIONS_DIR, f"{name}.json")
    data = (
        json.dumps(evaluation.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    ).encode()
    if not storage.create_exclusive(uri, data) and storage.read_bytes(uri) != data:
        log.warning("replacing %s, left by an evaluation session that did not commit", uri)
        storage.write_bytes(uri, data)
    return uri, storage.sha256_bytes(data)


def write_external_evaluation(
    directory: str, checkpoint_record_uri: str, evaluation: Evaluation
) -> str:
    """Keep an evaluation of another run's checkpoint in the evaluating stage's own
    `directory`, with the checkpoint's record URI, the sha256 of its bytes and the
    checkpoint's fingerprint (read now); the stage's record covers the file. Its URI."""
    data = storage.read_bytes(checkpoint_record_uri)
    record = StageRecord.model_validate(json.loads(data))
    external = ExternalEvaluation(
        **evaluation.model_dump(),
        checkpoint_record_uri=checkpoint_record_uri,
        checkpoint_record_digest=storage.sha256_bytes(data),
        checkpoint_fingerprint=record.output.fingerprint,
    )
    where = record_directory(checkpoint_record_uri)
    key = hashlib.sha256(where.encode()).hexdigest()[:12]  # two runs' directories share names
    name = f"{where.rsplit('/', 1)[-1]}-{key}.json"
    uri = storage.join(directory, EXTERNAL_EVALUATIONS_DIR, name)
    storage.write_json(uri, external.model_dump(mode="json"))
    return uri


def read_external_evaluations(stage_directory: str) -> list[tuple[str, ExternalEvaluation]]:
    """An evaluation stage's scores of other runs' checkpoints, oldest name first."""
    folder = storage.join(stage_directory, EXTERNAL_EVALUATIONS_DIR)
    return [
        (uri, ExternalEvaluation.model_validate(storage.read_json(uri)))
        for uri in (storage.join(folder, rel) for rel in sorted(storage.list_files(folder)))
    ]


def read_evaluations(stage_directory: str) -> list[tuple[str, Evaluation]]:
    """The evaluation files about a stage's checkpoint, oldest name first."""
    folder = storage.join(stage_directory, EVALUATIONS_DIR)
    return [
        (uri, Evaluation.model_validate(storage.read_json(uri)))
        for uri in (storage.join(folder, rel) for rel in sorted(storage.list_files(folder)))
    ]
