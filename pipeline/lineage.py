"""Lineage and audit, from the stage records alone: which data, config and code made an artifact.

Every record names its inputs (URI, fingerprint, the upstream record), its config, code
version, hardware, sessions and the Prefect flow-run ids, so `ancestry` walks from any
artifact back to the data sources without an orchestrator database. `audit` re-hashes every
file a record lists and checks that each input still matches its upstream output.
`openlineage_events` renders the same records as OpenLineage RunEvents (JSON lines).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from pipeline.lease import LEASE_NAME
from pipeline.manifest import MANIFEST_NAME, manifest_uri, pipeline_order, read_manifest
from schemas.cli_output import Code, EvaluationScores, LineageEntry, Machine
from schemas.record import ExternalEvaluation, LedgerEntry, RunManifest, StageRecord
from stages.core import evaluations as stage_evaluations
from stages.core import ledger, storage
from stages.core import records as stage_records
from stages.core.errors import MissingInput
from stages.core.metrics_logging import MLFLOW_DIR
from stages.core.records import RECORD_NAME, read_record

OPENLINEAGE_SCHEMA = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"
PRODUCER = "https://github.com/far-project/far"


@dataclass(frozen=True)
class LineageNode:
    """One stage record in an artifact's ancestry, with its upstream nodes."""

    name: str  # how the downstream stage calls this input ("dataset", "sft", ...)
    record_uri: str
    record: StageRecord
    parents: list[LineageNode] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # external source -> fingerprint


def find_record(uri: str) -> tuple[str, StageRecord]:
    """The record of the stage that produced `uri` (a stage dir, its output, or a file in it)."""
    found = stage_records.find_record(uri, levels=4)
    if found is None:
        raise FileNotFoundError(
            f"no FAR stage record for {uri}: expected {RECORD_NAME} in it or up to three "
            f"directories above (give an output URI as `far run` printed it)"
        )
    return found


def ancestry(uri: str, name: str = "artifact") -> LineageNode:
    """The record that produced `uri` and, recursively, the records of its inputs."""
    record_uri, record = find_record(uri)
    node = LineageNode(name, record_uri, record)
    for input_name, ref in sorted(record.input_artifacts.items()):
        if ref.record_uri is None:
            node.sources[ref.uri] = ref.fingerprint
        else:
            upstream = stage_records.resolve(record_uri, record, ref.record_uri)
            node.parents.append(ancestry(upstream, input_name))
    return node


def render(
    node: LineageNode,
    manifest: RunManifest | None = None,
    indent: str = "",
    seen: set[str] | None = None,
) -> str:
    """A readable tree: each stage, how it came to be, and where its inputs came from.

    A record reached twice (the dataset feeds every stage) is described once.
    """
    seen = set() if seen is None else seen
    r = node.record
    output_uri = stage_records.located_output(node.record_uri, r).uri
    if node.record_uri in seen:
        return f"{indent}{node.name}: {_label(r)} -> {output_uri} (described above)"
    seen.add(node.record_uri)
    sessions = ", ".join(s.outcome for s in r.sessions) or "complete"
    skipped = _skipped_in(manifest, node_id(r))
    lines = [
        f"{indent}{node.name}: {_label(r)} -> {output_uri}",
        f"{indent}  record {node.record_uri} (hash {r.stage_hash[:12]})",
        f"{indent}  sessions: {sessions}; {r.seconds:.1f} s; flow runs "
        + ", ".join(sorted({s.flow_run_id or "?" for s in r.sessions} or {r.flow_run_id or "?"})),
        f"{indent}  code: far {r.code.far_version} commit {r.code.git_commit or '?'} "
        f"stage v{r.code.stage_version}; tunix {r.code.packages.get('google-tunix', '?')}, "
        f"jax {r.code.packages.get('jax', '?')}",
        f"{indent}  hardware: {r.hardware.platform} {r.hardware.device_kind} "
        f"x{r.hardware.device_count} ({r.hardware.process_count} process)",
    ]
    if skipped:
        lines.append(f"{indent}  reused (skipped) in {skipped} later session(s)")
    if "sandbox_isolation_bwrap" in r.metrics:
        level = "bwrap" if r.metrics["sandbox_isolation_bwrap"] == 1.0 else "process"
        lines.append(f"{indent}  sandbox isolation: {level}")
    if r.metrics:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(r.metrics.items())[:6])
        lines.append(f"{indent}  metrics: {shown}")
    lines += _evaluation_lines(node.record_uri, indent)
    lines += _external_lines(node.record_uri, indent)
    for source, fingerprint in sorted(node.sources.items()):
        lines.append(f"{indent}  source {source} ({fingerprint})")
    for parent in node.parents:
        lines.append(render(parent, manifest, indent + "    ", seen))
    return "\n".join(lines)


def as_entry(node: LineageNode, manifest: RunManifest | None = None) -> LineageEntry:
    """The ancestry as `far lineage --json` prints it (what `render` shows, as data)."""
    r = node.record
    evaluations = stage_evaluations.read_evaluations(
        stage_records.record_directory(node.record_uri)
    )
    return LineageEntry(
        name=node.name,
        node=node_id(r),
        kind=r.stage,
        record_uri=node.record_uri,
        stage_hash=r.stage_hash,
        output_uri=stage_records.located_output(node.record_uri, r).uri,
        sessions=[s.outcome for s in r.sessions] or ["complete"],
        seconds=r.seconds,
        flow_run_ids=sorted({s.flow_run_id or "?" for s in r.sessions} or {r.flow_run_id or "?"}),
        skipped_sessions=_skipped_in(manifest, node_id(r)),
        code=Code(
            far_version=r.code.far_version,
            git_commit=r.code.git_commit,
            stage_version=r.code.stage_version,
            packages=r.code.packages,
        ),
        hardware=Machine(**r.hardware.model_dump()),
        metrics=r.metrics,
        evaluations=[EvaluationScores(uri=uri, scores=e.scores) for uri, e in evaluations],
        sources=node.sources,
        parents=[as_entry(parent, manifest) for parent in node.parents],
    )


def _evaluation_lines(record_uri: str, indent: str) -> list[str]:
    """One line per evaluation of this stage's checkpoint (its write-once evaluation files)."""
    lines = []
    for uri, evaluation in stage_evaluations.read_evaluations(
        stage_records.record_directory(record_uri)
    ):
        shown = ", ".join(
            f"{k}={evaluation.scores[k]:.4g}"
            for k in ("format_rate", "accuracy")
            if isinstance(evaluation.scores.get(k), int | float)
        )
        lines.append(f"{indent}  evaluated: {shown} ({uri})")
    return lines


def _external_lines(record_uri: str, indent: str) -> list[str]:
    """One line per checkpoint of another run that this evaluation scored (kept in its own
    directory): the checkpoint and the digest of its record as it was read."""
    lines = []
    for _, evaluation in stage_evaluations.read_external_evaluations(
        stage_records.record_directory(record_uri)
    ):
        shown = ", ".join(
            f"{k}={evaluation.scores[k]:.4g}"
            for k in ("format_rate", "accuracy")
            if isinstance(evaluation.scores.get(k), int | float)
        )
        lines.append(
            f"{indent}  scored another run's checkpoint: {shown} ({evaluation.checkpoint_uri}; "
            f"record {evaluation.checkpoint_record_digest})"
        )
    return lines


def _label(record: StageRecord) -> str:
    return record.stage if record.node is None else f"{record.node} ({record.stage})"


def _skipped_in(manifest: RunManifest | None, stage: str) -> int:
    if manifest is None:
        return 0
    return sum(1 for inv in manifest.invocations if inv.stages.get(stage) == "skipped")


def node_id(record: StageRecord) -> str:
    """The pipeline node a record belongs to (the default pipeline's ids are the kinds)."""
    return record.node or record.stage


def run_records(run_uri: str, problems: list[str] | None = None) -> list[tuple[str, StageRecord]]:
    """Every committed stage record of a run, in the DAG's order (nodes no longer in the
    recipe's DAG last), then by start time.

    With `problems` (the audit's), a torn run.json or an unreadable stage.json is noted
    there as a problem line and passed over (records then in name order); without, it raises.
    """
    order = _dag_order(run_uri, problems)
    found = []
    for name in storage.list_dirs(run_uri):
        record_uri = storage.join(run_uri, name, RECORD_NAME)
        try:
            record = read_record(record_uri)
        except ValueError as e:
            if problems is None:
                raise
            problems.append(f"{record_uri}: unreadable (a torn write or an edit): {_line(e)}")
            continue
        if record is not None:
            found.append((record_uri, record))
    rank = {node: i for i, node in enumerate(order)}
    return sorted(
        found, key=lambda item: (rank.get(node_id(item[1]), len(rank)), item[1].started_at)
    )


def _dag_order(run_uri: str, problems: list[str] | None) -> tuple[str, ...]:
    if problems is None:
        return pipeline_order(read_manifest(run_uri))
    try:
        return pipeline_order(read_manifest(run_uri))
    except MissingInput:
        raise
    except ValueError as e:  # not JSON, or not a manifest of this schema
        problems.append(
            f"{manifest_uri(run_uri)}: unreadable (a torn write or an edit): "
            f"{_line(e.__cause__ or e)}"
        )
        return ()


def _line(error: BaseException) -> str:
    """An error's message on one line, cut short (a problem line is one line)."""
    text = " ".join(str(error).split())
    return text if len(text) <= 200 else text[:197] + "..."


def audit(
    run_uri: str,
    key: SecretStr | None = None,
    expect_root: str | None = None,
    accept_later: bool = False,
) -> list[str]:
    """Problems found re-checking a run against its records; empty when everything matches.

    Checks every record's seal (an edited or unsealed stage.json), every file it lists
    (content digests), files added after the commit, each input against the upstream record as
    it was read, the evaluation files beside checkpoints against the evaluations that wrote
    them, files added at the run's top level, and the run's ledger: every record and run.json
    as chained, none removed or planted, the chain unbroken, signed with `key`, and, given
    `expect_root`, ending at that root (each entry after it is a problem, unless
    `accept_later`: `later_entries` lists them). A torn file is a problem line, not an error.
    """
    if not storage.exists(manifest_uri(run_uri)):
        read_manifest(run_uri)  # MissingInput: no run there
    problems: list[str] = []
    records = run_records(run_uri, problems)
    for record_uri, record in records:
        problems += _audit_seal(record_uri, record)
        problems += stage_records.verify_files(record_uri, record)
        problems += _audit_inputs(record_uri, record)
    problems += _audit_evaluations(run_uri, records)
    problems += _audit_external_evaluations(records)
    problems += _audit_top_level(run_uri)
    problems += _audit_top_directories(run_uri, _dag_order(run_uri, []), records)
    return problems + _audit_ledger(run_uri, records, key, expect_root, accept_later)


RUN_FILES = (MANIFEST_NAME, ledger.LEDGER_NAME, LEASE_NAME, f"{LEASE_NAME}.lock")
"""The files a run keeps at its top level; everything else there is added by someone else."""


def _audit_top_level(run_uri: str) -> list[str]:
    top = sorted(rel for rel in storage.list_files(run_uri) if "/" not in rel)
    return [
        f"{storage.join(run_uri, rel)}: file at the run's top level that no run writes (added)"
        for rel in top
        if rel not in RUN_FILES
    ]


RUN_DIRS = (MLFLOW_DIR,)
"""The directories a run keeps at its top level beside its stage directories."""
_STAGE_DIR = re.compile(r"^(?P<node>[a-z][a-z0-9_]{0,39})-[0-9a-f]{12}$")  # {node id}-{hash}


def _audit_top_directories(
    run_uri: str, order: tuple[str, ...], records: list[tuple[str, StageRecord]]
) -> list[str]:
    """Each directory at the run's top level that is neither a stage directory of a node of
    the run's DAG (any node, when run.json is unreadable) nor one of RUN_DIRS. A directory
    holding a stage record is judged by the record checks (a planted one is not in the
    ledger), so it is not reported twice."""
    recorded = {stage_records.record_directory(uri) for uri, _ in records}
    problems = []
    for name in sorted(storage.list_dirs(run_uri)):
        uri, stage = storage.join(run_uri, name), _STAGE_DIR.match(name)
        if name in RUN_DIRS or uri in recorded:
            continue
        if stage and (not order or stage["node"] in order):
            continue
        problems.append(
            f"{uri}: directory at the run's top level that is no stage of the run's DAG and "
            f"not FAR's (added)"
        )
    return problems


def later_entries(run_uri: str, expect_root: str | None) -> list[str]:
    """One line per ledger entry after `expect_root`: what `--accept-later` accepted."""
    if expect_root is None:
        return []
    later = ledger.after_root(ledger.scan(run_uri)[0], expect_root) or []
    return [
        f"accepted after the expected root: ledger entry {e.seq} ({e.kind} {e.path})" for e in later
    ]


def _audit_ledger(
    run_uri: str,
    records: list[tuple[str, StageRecord]],
    key: SecretStr | None,
    expect_root: str | None,
    accept_later: bool,
) -> list[str]:
    entries, unreadable = ledger.scan(run_uri)
    if not entries and not unreadable:
        return [
            f"{ledger.ledger_uri(run_uri)}: no ledger (removed, or the run predates ledgers): "
            f"a removed stage or an edited run.json cannot be detected"
        ]
    present = {ledger.relative(run_uri, uri) for uri, _ in records}
    return (
        unreadable
        + ledger.verify(run_uri, entries, key, expect_root, accept_later)
        + ledger.check_files(run_uri, entries, present)
    )


def record_doubts(
    run_uri: str,
    key: SecretStr | None = None,
    expect_root: str | None = None,
    accept_later: bool = False,
) -> dict[str, str]:
    """Each stage record of the run that the audit has not seen sealed by the run's own
    writer, with why: unreadable, unsealed or edited, not in the ledger, differing from its
    entry, or chained where the ledger cannot vouch for it (`ledger.trusted_prefix`). A run
    without a ledger (from before ledgers) is judged by its seals alone."""
    entries, _ = ledger.scan(run_uri)
    trusted, why_not = ledger.trusted_prefix(entries, key, expect_root, accept_later)
    position = {e.path: i for i, e in enumerate(entries)}
    doubts = {}
    for name in storage.list_dirs(run_uri):
        record_uri = storage.join(run_uri, name, RECORD_NAME)
        if not storage.exists(record_uri):
            continue
        doubt = _record_doubt(record_uri, entries, position, trusted, why_not)
        if doubt:
            doubts[record_uri] = doubt
    return doubts


def _record_doubt(
    record_uri: str,
    entries: list[LedgerEntry],
    position: dict[str, int],
    trusted: int,
    why_not: str,
) -> str | None:
    data = storage.read_bytes(record_uri)
    try:
        record = read_record(record_uri)
    except ValueError:
        return "record unreadable (a torn write or an edit)"
    if record is None or _audit_seal(record_uri, record):
        return "record unsealed or edited after its commit"
    if not entries:
        return why_not or None
    path = record_uri.rsplit("/", 2)[-2] + "/" + RECORD_NAME
    if path not in position:
        return "record not in the ledger (planted)"
    at = position[path]
    if entries[at].sha256 != storage.sha256_bytes(data):
        return f"record differs from its ledger entry {entries[at].seq} (rewritten)"
    return why_not if at >= trusted else None


def coverage(key: SecretStr | None, expect_root: str | None) -> str:
    """What an audit with these means can and cannot detect, in one sentence."""
    if expect_root is None and key is None:
        return (
            "note: no --expect-root and no FAR_AUDIT_KEY: the ledger was checked against itself "
            "only, so a writer who can rewrite all of storage (records, seals and ledger "
            "recomputed) cannot be detected"
        )
    pinned = [
        *(["the published root"] if expect_root else []),
        *(["the signing key"] if key else []),
    ]
    return (
        f"checked against {' and '.join(pinned)}: a rewrite of storage is detected unless the "
        f"writer also holds the signing key (or changed the published root)"
    )


def _audit_seal(record_uri: str, record: StageRecord) -> list[str]:
    if record.digest is None:
        return [f"{record_uri}: record has no seal (its digest is null)"]
    if stage_records.record_digest(record) == record.digest:
        return []
    return [f"{record_uri}: record edited after its commit (its digest no longer matches)"]


def _audit_inputs(record_uri: str, record: StageRecord) -> list[str]:
    problems = []
    for name, ref in record.input_artifacts.items():
        if ref.record_uri is None:
            continue
        upstream_uri = stage_records.resolve(record_uri, record, ref.record_uri)
        try:
            upstream = read_record(upstream_uri)  # in this run as it is now, or another run's
        except ValueError:
            problems.append(f"{record_uri}: input {name} record {upstream_uri} is unreadable")
            continue
        if upstream is None:
            problems.append(f"{record_uri}: input {name} record {upstream_uri} is missing")
            continue
        if upstream.output.fingerprint != ref.fingerprint:
            now = upstream.output.fingerprint[:12]
            problems.append(
                f"{record_uri}: input {name} was {ref.fingerprint[:12]}, its record now says {now}"
            )
        read_then = ref.record_digest
        if read_then and storage.sha256_bytes(storage.read_bytes(upstream_uri)) != read_then:
            problems.append(
                f"{upstream_uri}: record changed since {record.stage} consumed it "
                f"(input {name} of {record_uri})"
            )
    return problems


def _audit_evaluations(run_uri: str, records: list[tuple[str, StageRecord]]) -> list[str]:
    """Each evaluation file beside a checkpoint must be listed, with its sha256, by the
    committed evaluation that wrote it."""
    listed: dict[str, str] = {}
    for record_uri, record in records:
        if stage_evaluations.EVALUATIONS_INDEX in record.files:  # whichever stage wrote evaluations
            index = storage.join(
                stage_records.record_directory(record_uri), stage_evaluations.EVALUATIONS_INDEX
            )
            for uri, sha256 in _evaluation_index(index).items():
                # {run}/{checkpoint stage dir}/evaluations/{file}: found in this run as it is now
                where = "/".join(uri.rsplit("/", 3)[-3:])
                listed[storage.join(stage_records.record_run(record_uri), where)] = sha256
    problems = []
    present = set()
    for record_uri, _ in records:
        folder = storage.join(
            stage_records.record_directory(record_uri), stage_records.EVALUATIONS_DIR
        )
        for rel in sorted(storage.list_files(folder)):
            uri = storage.join(folder, rel)
            present.add(uri)
            if uri not in listed:
                problems.append(f"{uri}: evaluation file not listed by any committed evaluation")
            elif storage.sha256_bytes(storage.read_bytes(uri)) != listed[uri]:
                problems.append(f"{uri}: evaluation file edited after it was written")
    problems += [f"{uri}: evaluation file missing" for uri in sorted(set(listed) - present)]
    return problems


def _audit_external_evaluations(records: list[tuple[str, StageRecord]]) -> list[str]:
    """Each score of another run's checkpoint, kept in the evaluating stage's own directory
    (its bytes are covered by that stage's record): the checkpoint's record still has the
    digest it had when evaluated, is sealed, and its files still match it."""
    problems = []
    for record_uri, _ in records:
        directory = stage_records.record_directory(record_uri)
        try:
            found = stage_evaluations.read_external_evaluations(directory)
        except (OSError, ValueError) as e:
            problems.append(f"{directory}: an external evaluation file is unreadable ({e})")
            continue
        for uri, evaluation in found:
            problems += _audit_external_checkpoint(uri, evaluation)
    return problems


def _audit_external_checkpoint(uri: str, evaluation: ExternalEvaluation) -> list[str]:
    checkpoint = evaluation.checkpoint_record_uri
    if not storage.exists(checkpoint):
        return [f"{uri}: the evaluated checkpoint's record {checkpoint} is missing"]
    data = storage.read_bytes(checkpoint)
    if storage.sha256_bytes(data) != evaluation.checkpoint_record_digest:
        return [f"{uri}: the evaluated checkpoint's record {checkpoint} changed since it was read"]
    record = StageRecord.model_validate_json(data)  # the bytes that were read and parsed then
    found = _audit_seal(checkpoint, record) + stage_records.verify_files(checkpoint, record)
    return [f"{uri}: evaluated checkpoint: {problem}" for problem in found]


def _evaluation_index(uri: str) -> dict[str, str]:
    """An evaluation's {evaluation file: sha256}; empty when torn or missing (its record's
    file digests already report that)."""
    try:
        index = storage.read_json(uri)
    except (OSError, ValueError):
        return {}
    if not isinstance(index, dict):
        return {}
    return {str(k): str(v) for k, v in index.items()}


def openlineage_events(run_uri: str) -> list[dict[str, Any]]:
    """OpenLineage RunEvents for every session of every committed stage of a run; each carries
    the run's ledger root (a far_ledger run facet), so a lineage backend keeps it too."""
    events = []
    root = ledger.root(run_uri)
    for _, record in run_records(run_uri):
        for index, session in enumerate(record.sessions):
            where = f"{record.run}/{record.directory.rsplit('/', 1)[-1]}"
            run_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{where}#{index}"))
            end_type = {"complete": "COMPLETE", "stopped": "ABORT", "failed": "FAIL"}
            common = {
                "run": _run_facets(run_id, record, session.flow_run_id, root),
                "job": {"namespace": f"far/{record.run}", "name": node_id(record)},
            }
            events.append(_event("START", session.started_at.isoformat(), common, record, False))
            events.append(
                _event(
                    end_type[session.outcome],
                    session.finished_at.isoformat(),
                    common,
                    record,
                    session.outcome == "complete",
                )
            )
    return events


def _event(
    kind: str, time: str, common: dict[str, Any], record: StageRecord, outputs: bool
) -> dict[str, Any]:
    inputs = [
        _dataset(ref.uri, ref.fingerprint, external=ref.record_uri is None)
        for ref in record.input_artifacts.values()
    ]
    return {
        "eventType": kind,
        "eventTime": time,
        "producer": PRODUCER,
        "schemaURL": OPENLINEAGE_SCHEMA,
        **common,
        "inputs": inputs,
        "outputs": [_dataset(record.output.uri, record.output.fingerprint)] if outputs else [],
    }


def _run_facets(
    run_id: str, record: StageRecord, flow_run_id: str | None, root: str | None
) -> dict[str, Any]:
    facet = {
        "_producer": PRODUCER,
        "_schemaURL": f"{PRODUCER}/schemas/far-stage-facet.json",
        "stage_hash": record.stage_hash,
        "config": record.config,
        "metrics": record.metrics,
        "code": record.code.model_dump(mode="json"),
        "hardware": record.hardware.model_dump(mode="json"),
        "prefect_flow_run_id": flow_run_id,
    }
    ledger_facet = {
        "_producer": PRODUCER,
        "_schemaURL": f"{PRODUCER}/schemas/far-ledger-facet.json",
        "root": root,
    }
    return {"runId": run_id, "facets": {"far_stage": facet, "far_ledger": ledger_facet}}


def _dataset(uri: str, fingerprint: str, external: bool = False) -> dict[str, Any]:
    """OpenLineage dataset naming: namespace 'gs://bucket' / 'file', name the path.

    External sources are named by kind ('reasoning_gym:basic_arithmetic' -> namespace
    'far-source/reasoning_gym'); file sources by their path or URI.
    """
    kind, _, rest = uri.partition(":")
    if external and kind != "file":
        namespace, name = f"far-source/{kind}", rest
    elif external:
        return _dataset(rest, fingerprint)
    elif "://" in uri and not uri.startswith("file://"):
        scheme, rest = uri.split("://", 1)
        bucket, _, path = rest.partition("/")
        namespace, name = f"{scheme}://{bucket}", "/" + path
    else:
        namespace, name = "file", storage.normalize(uri)
    facet = {
        "_producer": PRODUCER,
        "_schemaURL": f"{PRODUCER}/schemas/far-fingerprint.json",
        "fingerprint": fingerprint,
    }
    return {"namespace": namespace, "name": name, "facets": {"far_fingerprint": facet}}


def export_problems(
    record_uris: list[str],
    key: SecretStr | None = None,
    expect_root: str | None = None,
    accept_later: bool = False,
) -> list[str]:
    """What stops `far export` from vouching for a checkpoint: the first of `record_uris` is
    its stage's record, the rest the upstream records its model card lists. Each record, and
    each evaluation's record whose scores the card shows, must be one the audit trusts
    (`record_doubts`: sealed, in the ledger as written, covered by the key and
    `expect_root`); the checkpoint's files must match its record (`stage_records.verify_files`) and
    its evaluation files their evaluations (`_audit_evaluations`), as the audit checks them.
    Empty when the export may go ahead."""
    checkpoint_record = record_uris[0]
    run_uri = stage_records.record_run(checkpoint_record)
    folder = storage.join(
        stage_records.record_directory(checkpoint_record), stage_records.EVALUATIONS_DIR
    )
    records = run_records(run_uri)
    vouched = [*record_uris, *_evaluators(records, folder)]
    doubts = record_doubts(run_uri, key, expect_root, accept_later)
    problems = [f"{uri}: {doubts[uri]}" for uri in vouched if uri in doubts]
    record = read_record(checkpoint_record)
    if record is not None:
        problems += stage_records.verify_files(checkpoint_record, record)
    evaluations = _audit_evaluations(run_uri, records)
    return problems + [p for p in evaluations if p.startswith(folder + "/")]


def _evaluators(records: list[tuple[str, StageRecord]], folder: str) -> list[str]:
    """The records whose evaluation index lists a file in `folder`."""
    found = []
    for record_uri, record in records:
        if stage_evaluations.EVALUATIONS_INDEX in record.files:
            index = storage.join(
                stage_records.record_directory(record_uri), stage_evaluations.EVALUATIONS_INDEX
            )
            names = ("/".join(uri.rsplit("/", 3)[-3:]) for uri in _evaluation_index(index))
            run = stage_records.record_run(record_uri)
            if any(storage.join(run, name).startswith(folder + "/") for name in names):
                found.append(record_uri)
    return found
