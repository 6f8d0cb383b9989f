"""`far validate`'s plan is the run's: both decide each node with the same code
(stages.core.decisions.decide), so on the same tampered copy of a run each row of the plan says
what the run then does.

The run is built once for the module: the smoke recipe's data_prep, really run on a small
file source, and its sft stage committed under its real stage identity with a small
checkpoint as its work (no training: what is under test is the decision, not SFT). Each case
copies it, tampers with the copy, then runs `far validate` on it and the run's own node runner
(pipeline/nodes.py, what the flow calls per node, without Prefect). The run's sessions have
a deadline that has passed, so a stage it would not skip stops right where its work would
start (SessionExpired, raised after the decision): nothing trains.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows import cli
from pipeline.dag import build_dag, node_config
from pipeline.manifest import manifest_uri
from pipeline.nodes import run_node
from pipeline.recipes import load_recipe
from schemas.artifacts import CheckpointArtifact
from schemas.recipe import Recipe
from schemas.record import RunManifest
from stages.core import storage
from stages.core.errors import InputError
from stages.core.records import IDENTITY_NAME, RECORD_NAME
from stages.core.runner import RunContext, SessionExpired, run_stage, with_uris
from stages.modeling.tokenizers import build_tokenizer
from tests.conftest import smoke_data

RUN = "plan"


def rows(n: int, offset: int = 0) -> str:
    lines = [
        {
            "question": f"What is {i} + {i + offset + 1}?",
            "answer": f"{i} + {i + offset + 1} = {2 * i + offset + 1}\n#### {2 * i + offset + 1}",
        }
        for i in range(n)
    ]
    return "".join(json.dumps(r) + "\n" for r in lines)


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, model_cache: str) -> Path:
    """A folder with rows.jsonl, recipe.yaml (paths relative to the folder) and runs/plan:
    data_prep committed by a real run, sft committed under its real identity."""
    base = tmp_path_factory.mktemp("plan-run")
    (base / "rows.jsonl").write_text(rows(40))
    data = smoke_data()
    source = {"kind": "file", "name": "rows.jsonl", "adapter": "gsm8k"}
    data["data"].update(
        {
            "eval": {"size": 4, "sources": [source]},
            "grpo": {"size": 4, "sources": [source]},
            "sft": {"size": 16, "sources": [source]},
        }
    )
    data.update(name=RUN, storage_root="runs", sft={**data["sft"], "max_steps": 2})
    (base / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    cwd = Path.cwd()
    os.chdir(base)
    try:
        recipe = load_recipe("recipe.yaml")
        ctx = RunContext(root=str(base / "runs"), run=RUN, cache_dir=model_cache)
        manifest = RunManifest(
            run=RUN,
            recipe=recipe.model_dump(mode="json"),
            recipe_source="recipe.yaml",
            created_at=datetime.now(UTC),
        )
        storage.write_json(manifest_uri(ctx.run_uri), manifest.model_dump(mode="json"))
        prep = build_dag(recipe).nodes[0]
        dataset = run_node(recipe, prep, node_config(recipe, prep), {}, ctx).output
        commit_sft(recipe, dataset, dataclasses.replace(ctx, node="sft"))
    finally:
        os.chdir(cwd)
    return base


def commit_sft(recipe: Recipe, dataset: Any, ctx: RunContext) -> None:
    """sft's directory under the identity stages.sft computes, with a one-step checkpoint."""
    from stages import sft

    tokenizer = build_tokenizer(recipe.model, ctx.model_cache).name

    def work(directory: str) -> tuple[CheckpointArtifact, dict[str, float], dict[str, Any]]:
        checkpoints = storage.join(directory, "checkpoints")
        storage.write_bytes(storage.join(checkpoints, "2/w"), b"weights")
        artifact = CheckpointArtifact(
            uri=checkpoints,
            step=2,
            model=recipe.model,
            tokenizer=tokenizer,
            lora=recipe.sft.lora,
            size_bytes=7,
            fingerprint=storage.tree_fingerprint(checkpoints),
        )
        return artifact, {}, {}

    identity = sft.identity(recipe.sft, recipe.model, dataset.fingerprint)
    run_stage(ctx, with_uris(identity, dataset=dataset.uri), work)


@pytest.fixture
def copy(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The built run copied; the working directory is the copy (its recipe's paths resolve
    there)."""
    target = tmp_path / "copy"
    shutil.copytree(built, target)
    monkeypatch.chdir(target)
    return target


def plan(capsys: pytest.CaptureFixture[str], model_cache: str) -> tuple[int, dict[str, str], str]:
    """`far validate` on the copy: its exit code, each node's action, stderr."""
    code = cli.main(["validate", "recipe.yaml", "--cache-dir", model_cache])
    out, err = capsys.readouterr()
    actions = {line.split()[0]: line.split()[3] for line in out.splitlines()[2:]}
    hashes = {line.split()[0]: line.split()[2] for line in out.splitlines()[2:]}
    return code, {**actions, **{f"{n}#hash": h for n, h in hashes.items()}}, err


def run(model_cache: str) -> dict[str, str]:
    """The run's node runner on data_prep and sft, in order: each node's outcome (skip, ran,
    would work: its work was about to start when the passed deadline stopped it, refused)."""
    recipe = load_recipe("recipe.yaml")
    ctx = RunContext(root=str(Path("runs").resolve()), run=RUN, cache_dir=model_cache)
    outputs: dict[str, Any] = {}
    outcomes: dict[str, str] = {}
    for node in build_dag(recipe).nodes[:2]:
        node_ctx = ctx if node.id == "data_prep" else dataclasses.replace(ctx, deadline=1.0)
        inputs = {name: outputs[source] for name, source in node.inputs.items()}
        try:
            outcome = run_node(recipe, node, node_config(recipe, node), inputs, node_ctx)
        except SessionExpired:
            outcomes[node.id] = "would work"
            break
        except InputError as e:
            outcomes[node.id] = f"refused: {type(e).__name__}"
            break
        outputs[node.id] = outcome.output
        outcomes[node.id] = "skip" if outcome.skipped else "ran"
        outcomes[f"{node.id}#hash"] = outcome.record_uri.rsplit("/", 2)[-2].rsplit("-", 1)[-1]
    return outcomes


def directory(node: str) -> Path:
    [found] = [p for p in (Path("runs") / RUN).glob(f"{node}-*") if (p / RECORD_NAME).exists()]
    return found


def test_untouched_both_skip(
    copy: Path, capsys: pytest.CaptureFixture[str], model_cache: str
) -> None:
    code, shown, err = plan(capsys, model_cache)
    assert code == 0, err
    assert shown["data_prep"] == shown["sft"] == "skip"
    done = run(model_cache)
    assert done["data_prep"] == done["sft"] == "skip"
    assert shown["sft#hash"] == done["sft#hash"]


def test_edited_data_file(copy: Path, capsys: pytest.CaptureFixture[str], model_cache: str) -> None:
    Path("rows.jsonl").write_text(rows(40, offset=1))  # same recipe, other content
    code, shown, err = plan(capsys, model_cache)
    assert code == cli.EXIT_INVALID and shown["data_prep"] == "refused"
    assert "data.source_content" in err and len(err.strip().splitlines()) == 1
    assert shown["sft"] == "-"
    assert run(model_cache) == {"data_prep": "refused: DriftError"}


def test_checkpoint_byte_flip(
    copy: Path, capsys: pytest.CaptureFixture[str], model_cache: str
) -> None:
    weights = directory("sft") / "checkpoints" / "2" / "w"
    weights.write_bytes(b"Weights")  # same size, one byte
    code, shown, err = plan(capsys, model_cache)
    assert code == cli.EXIT_INVALID, err
    assert (shown["data_prep"], shown["sft"]) == ("skip", "refused")
    assert "no longer matches its record" in err and "checkpoints/2/w: altered" in err
    done = run(model_cache)
    assert (done["data_prep"], done["sft"]) == ("skip", "refused: TamperedStage")


def test_nulled_record_digest(
    copy: Path, capsys: pytest.CaptureFixture[str], model_cache: str
) -> None:
    record = directory("data_prep") / RECORD_NAME
    record.write_text(json.dumps({**json.loads(record.read_text()), "digest": None}))
    code, shown, err = plan(capsys, model_cache)
    assert code == cli.EXIT_INVALID and shown["data_prep"] == "refused"
    assert "record unsealed or edited" in err
    assert run(model_cache) == {"data_prep": "refused: TamperedStage"}


def test_planted_newer_directory(
    copy: Path, capsys: pytest.CaptureFixture[str], model_cache: str
) -> None:
    """A copy of sft's directory under another hash, started later: `far status` reads it as
    sft's current directory, but the run uses the one its identity names."""
    real = directory("sft")
    planted = real.with_name("sft-0123456789ab")
    shutil.copytree(real, planted)
    identity = json.loads((planted / IDENTITY_NAME).read_text())
    later = {**identity, "created_at": "2999-01-01T00:00:00+00:00"}
    (planted / IDENTITY_NAME).write_text(json.dumps(later))
    code, shown, err = plan(capsys, model_cache)
    assert code == 0, err
    done = run(model_cache)
    assert shown["sft"] == done["sft"] == "skip"
    assert shown["sft#hash"] == done["sft#hash"] == real.name.rsplit("-", 1)[1]


def test_removed_record(copy: Path, capsys: pytest.CaptureFixture[str], model_cache: str) -> None:
    """data_prep's stage.json deleted: the run computes it again in its directory and commits;
    what sft does then depends on the new dataset, which the plan says."""
    (directory("data_prep") / RECORD_NAME).unlink()
    code, shown, err = plan(capsys, model_cache)
    assert code == 0, err
    assert (shown["data_prep"], shown["sft"]) == ("continue", "depends")
    done = run(model_cache)
    assert done["data_prep"] == "ran" and done["sft"] in ("skip", "would work")


def test_validate_writes_nothing_into_the_run(
    copy: Path, capsys: pytest.CaptureFixture[str], model_cache: str
) -> None:
    """Planning a node that a run would work on leaves no directory or identity behind."""
    (directory("data_prep") / RECORD_NAME).unlink()
    before = sorted(str(p) for p in Path("runs").rglob("*"))
    assert plan(capsys, model_cache)[0] == 0
    assert sorted(str(p) for p in Path("runs").rglob("*")) == before


class CountingFileSystem:
    """An fsspec filesystem whose every call is noted (method, path) before it runs."""

    def __init__(self, fs: Any, calls: list[tuple[str, str]]) -> None:
        self._fs, self._calls = fs, calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if not callable(attr):
            return attr

        def noted(*args: Any, **kwargs: Any) -> Any:
            self._calls.append((name, str(args[0]) if args else ""))
            return attr(*args, **kwargs)

        return noted


def test_validate_reads_each_stage_file_once(
    copy: Path,
    capsys: pytest.CaptureFixture[str],
    model_cache: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`far validate` decides every node in one pass over the run's storage: each call that
    reaches the filesystem (an existence test, a read, a listing) is made once per path, and
    a committed stage directory costs a bounded number of them beyond hashing each of its
    files once: its identity and record tested and read, the directory tested and listed,
    and its output looked at by the stage it feeds (a fixed few, not a few per check)."""
    calls: list[tuple[str, str]] = []
    split = storage._split
    monkeypatch.setattr(
        storage, "_split", lambda uri: (CountingFileSystem(split(uri)[0], calls), split(uri)[1])
    )
    code, shown, err = plan(capsys, model_cache)
    assert code == 0 and shown["data_prep"] == shown["sft"] == "skip", err
    run_dir = str((copy / "runs" / RUN).resolve())
    in_run = [(method, path) for method, path in calls if path.startswith(run_dir + "/")]
    repeated = {call: n for call, n in Counter(in_run).items() if n > 1}
    assert not repeated, repeated
    for node in ("data_prep", "sft"):
        stage_dir = str(directory(node).resolve())
        files = [p for p in Path(stage_dir).rglob("*") if p.is_file()]
        mine = [(m, p) for m, p in in_run if p == stage_dir or p.startswith(stage_dir + "/")]
        hashed = [(m, p) for m, p in mine if m == "open"]
        assert len(hashed) == len(files), (node, mine)
        assert len(mine) - len(hashed) <= 8, (node, mine)
