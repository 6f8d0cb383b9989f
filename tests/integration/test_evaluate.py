"""The evaluation stage on the tiny model: batched greedy outputs equal batch-size-1 outputs,
checkpoints by URI, sampling metrics, report files, and scores written into records."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from PIL import Image

from pipeline import lineage
from pipeline.manifest import write_manifest
from schemas.artifacts import CheckpointArtifact, DatasetArtifact, EvalReport
from schemas.recipe import EvalConfig, Recipe
from schemas.record import RunManifest, StageRecord
from stages import sft
from stages.core import ledger, storage
from stages.core.datasets import load_prompts
from stages.core.evaluations import read_evaluations, read_external_evaluations
from stages.core.progress import ProgressUpdate
from stages.core.records import find_checkpoint_record
from stages.core.runner import RunContext, SessionExpired
from stages.core.sessions import StopFlag
from stages.data_prep import build as data_prep
from stages.evaluate import evaluation as evaluate
from stages.modeling import export_card, models
from stages.modeling.tokenizers import ByteTokenizer
from tests.conftest import REPO, _free_port, _wait_for_port, recipe_with
from tests.hub_server import TOKEN
from tests.unit.test_sampling import spy_on_inverse_cdf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Recipe, RunContext, DatasetArtifact, CheckpointArtifact]:
    root = str(tmp_path_factory.mktemp("eval-root"))
    recipe = recipe_with(root, sft={"max_steps": 120})
    ctx = RunContext(root, "ev")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    return (
        recipe,
        ctx,
        dataset,
        sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output,
    )


def test_batched_greedy_equals_batch_size_one(trained) -> None:
    recipe, _, _, checkpoint = trained
    mesh = models.build_mesh(recipe.mesh)
    network = models.restore_policy(
        checkpoint, models.build_base_model(recipe.model, mesh, ""), mesh
    )
    chat = data_prep.chat_prompt
    prompts = [
        "Q",
        "1+1=",
        chat("Calculate 3 * 4."),
        chat("Calculate ( -9 / 3 ), carefully."),
        "The quick brown fox",
        chat("Calculate 12 - 5."),
        "x" * 40,
    ]  # 2 to 115 tokens
    config = EvalConfig(max_generation_tokens=24, batch_size=4)
    with mesh:
        one = [
            evaluate.generate(
                network,
                ByteTokenizer(),
                [p],
                config.model_copy(update={"batch_size": 1}),
                128,
                recipe.model,
            )[0]
            for p in prompts
        ]
        batched = evaluate.generate(network, ByteTokenizer(), prompts, config, 128, recipe.model)
    assert batched == one
    assert len(set(one)) > 1 and any("<answer>" in c for c in one)  # real, varied outputs


def test_report_files_scores_and_records(trained) -> None:
    recipe, ctx, dataset, checkpoint = trained
    config = recipe.eval.model_copy(
        update={"models": ["base", "sft", checkpoint.uri], "max_generation_tokens": 24}
    )
    outcome = evaluate.evaluate(
        dataset, {"sft": checkpoint}, config, recipe.model, recipe.mesh, ctx
    )
    report = outcome.output
    directory = report.uri.rsplit("/", 1)[0]
    assert EvalReport.model_validate(storage.read_json(report.uri)) == report
    by_name = {s.name: s for s in report.scores}
    assert by_name["sft"].format_rate == by_name[checkpoint.uri].format_rate  # same weights
    assert by_name["sft"].format_rate > by_name["base"].format_rate
    assert set(by_name["sft"].by_domain) == {"math"}
    table = storage.read_text(f"{directory}/report.md")
    assert table.startswith("| model | prompts | format rate [95% CI] | accuracy [95% CI]")
    assert all(f"| {name} |" in table for name in ("base", "base-3shot", "sft"))
    # the base model also sees 3 worked SFT examples; each row is compared with the previous
    assert [s.name for s in report.scores][:3] == ["base", "base-3shot", "sft"]
    assert "| sft | base-3shot |" in table and "exact McNemar" in table
    sft_metrics = by_name["sft"].metrics
    assert 0 <= sft_metrics["vs_previous/p_value"] <= 1
    assert sft_metrics["format_rate_ci_low"] <= by_name["sft"].format_rate
    assert by_name["sft"].format_rate <= sft_metrics["format_rate_ci_high"]
    eval_record = StageRecord.model_validate(storage.read_json(outcome.record_uri))
    assert "sft/vs_previous/p_value" in eval_record.metrics
    for png in ("metrics.png", "training.png"):
        with Image.open(Path(directory, png)) as image:
            assert image.format == "PNG" and image.size[0] > 200
    samples = storage.read_text(report.samples_uri).splitlines()
    assert len(samples) == 4 * recipe.data.eval.size
    assert {"model", "completion", "correct", "format"} <= set(json.loads(samples[0]))
    rows = [json.loads(line) for line in samples]
    by_model = {
        m: [r["completion"] for r in rows if r["model"] == m] for m in ("sft", checkpoint.uri)
    }
    assert by_model["sft"] == by_model[checkpoint.uri]  # the URI is sft's checkpoint: reused,
    assert eval_record.metrics["sft/sampler_decode_compilations"] == 1  # not decoded again
    assert f"{checkpoint.uri}/sampler_decode_compilations" not in eval_record.metrics
    record_uri, record = find_checkpoint_record(checkpoint.uri)
    assert record.evaluations == []  # the checkpoint's record is never rewritten
    [(_, written)] = read_evaluations(record_uri.rsplit("/", 1)[0])
    assert written.evaluation == directory and written.report_uri == report.uri
    assert written.scores["format_rate"] == by_name["sft"].format_rate


def started_run(root: str, run: str, recipe: Recipe) -> str:
    """A run's run.json as `far run` writes it (kept if there is one): `far audit` reads it."""
    run_uri = storage.join(root, run)
    if not storage.exists(f"{run_uri}/run.json"):
        manifest = RunManifest(
            run=run,
            recipe=recipe.model_dump(mode="json"),
            recipe_source="smoke.yaml",
            created_at=datetime.now(UTC),
        )
        write_manifest(run_uri, manifest)
    return run_uri


def tree_digests(folder: str) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): storage.sha256_file(str(p))
        for p in sorted(Path(folder).rglob("*"))
        if p.is_file()
    }


def test_scoring_another_runs_checkpoint_leaves_that_run_as_it_was(
    trained, tmp_path: Path, capsys
) -> None:
    from flows.cli import main

    recipe, ctx, _, checkpoint = trained
    first = started_run(ctx.root, ctx.run, recipe)
    before = tree_digests(first)
    second = RunContext(str(tmp_path), "scorer", cache_dir=ctx.cache_dir)
    started_run(second.root, second.run, recipe)
    dataset = data_prep.prepare(recipe.data, recipe.model, second).output
    config = recipe.eval.model_copy(
        update={"models": ["base", checkpoint.uri], "max_generation_tokens": 16, "base_shots": 0}
    )
    outcome = evaluate.evaluate(dataset, {}, config, recipe.model, recipe.mesh, second)
    assert tree_digests(first) == before  # the scored run: not one byte changed or added
    assert main(["audit", first]) == 0 and main(["audit", second.run_uri]) == 0
    assert capsys.readouterr().out.count("everything matches") == 2
    directory = outcome.record_uri.rsplit("/", 1)[0]
    [(_, scored)] = read_external_evaluations(directory)
    record_uri, _ = find_checkpoint_record(checkpoint.uri)
    assert scored.checkpoint_record_uri == record_uri and scored.checkpoint_uri == checkpoint.uri
    assert scored.checkpoint_record_digest == storage.sha256_file(record_uri)
    by_name = {s.name: s for s in outcome.output.scores}
    assert scored.scores["accuracy"] == by_name[checkpoint.uri].accuracy


def test_sampling_gives_pass_at_k(trained, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, ctx, dataset, checkpoint = trained
    traced = spy_on_inverse_cdf(monkeypatch)
    sampling = {
        "models": ["sft"],
        "temperature": 0.8,
        "samples": 3,
        "draw": "inverse_cdf",  # one uniform number per token (tests/unit/test_sampling.py)
        "max_generation_tokens": 24,
        "batch_size": 8,
        "max_prompts": recipe.data.eval.size // 2,  # sampled on the split's first half
    }
    config = recipe.eval.model_copy(update=sampling)
    # another eval config is another run: within one run the drift guard refuses it
    other_run = RunContext(ctx.root, "ev-sampling")
    report = evaluate.evaluate(
        dataset, {"sft": checkpoint}, config, recipe.model, recipe.mesh, other_run
    ).output
    metrics = report.scores[0].metrics
    assert metrics["pass@3"] >= metrics["pass@1"]
    samples = [json.loads(line) for line in storage.read_text(report.samples_uri).splitlines()]
    first_half = [r["id"] for r in load_prompts(dataset, "eval")][: recipe.data.eval.size // 2]
    assert [s["id"] for s in samples[::3]] == first_half  # 3 samples each, in the split's order
    assert len(samples) == 3 * len(first_half)
    assert traced  # the evaluation's sampler traced its decode step with that draw


@pytest.fixture
def local_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """(endpoint, where its repositories' files are) of tests/hub_server.py on a free port;
    HF_HOME is empty, so the only token is the one a test sets in HF_TOKEN."""
    port, store = _free_port(), tmp_path / "hub"
    store.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.hub_server", str(store), str(port)], cwd=REPO
    )
    try:
        _wait_for_port(port, proc)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
        yield f"http://127.0.0.1:{port}", store
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_far_export_cli_on_the_tiny_checkpoint(
    trained, tmp_path: Path, capsys, local_hub, monkeypatch
) -> None:
    from flows.cli import EXIT_INVALID, main

    recipe, ctx, _, checkpoint = trained
    endpoint, store = local_hub
    # the run's manifest as `far run` writes it: the card names the recipe from it
    write_manifest(
        ctx.run_uri,
        RunManifest(
            run=ctx.run,
            recipe=recipe.model_dump(mode="json"),
            recipe_source="smoke.yaml",
            created_at=datetime.now(UTC),
        ),
    )
    # an evaluation that another run wrote beside this checkpoint (test_sampling's) is one no
    # evaluation of this run lists: the audit flags it, and so export refuses to show it
    for problem in lineage.audit(ctx.run_uri):
        if problem.endswith(": evaluation file not listed by any committed evaluation"):
            Path(problem.split(": ", 1)[0]).unlink()
    out = tmp_path / "hf"
    far = ["export", checkpoint.uri, str(out), "--cache-dir", str(tmp_path)]
    push = ["--push-to", "tester/smoke-sft", "--hub-endpoint", endpoint]
    # no token, a hub that is not there, a bad token: one line naming the flag, nothing written
    for env, flags, expected in [
        ({}, push, "--push-to tester/smoke-sft: no Hugging Face token"),
        ({"HF_TOKEN": TOKEN}, [*push[:3], "http://127.0.0.1:9"], "--hub-endpoint http://127."),
        ({"HF_TOKEN": "hf_wrong"}, push, "refused the token (HTTP 401)"),
    ]:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert main([*far, *flags]) == EXIT_INVALID
        err = capsys.readouterr().err.strip()
        assert expected in err and "\n" not in err, err
        assert not out.exists()
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert main([*far, *push]) == 0
    files = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "README.md"} <= files
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= files
    assert json.loads((out / "config.json").read_text())["model_type"] == "gemma3_text"
    # the hub repository holds the same files, byte for byte, and transformers loads it
    pushed = store / "tester" / "smoke-sft"
    assert {p.name: p.read_bytes() for p in pushed.iterdir()} == {
        p.name: p.read_bytes() for p in out.iterdir()
    }
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(pushed))
    assert hf.generation_config.eos_token_id == [1, 4]
    check_card((out / "README.md").read_text(), recipe, checkpoint, ctx.run_uri)
    # the adapter alone, with the base's export beside it: peft gives the merged logits
    adapter = tmp_path / "adapter"
    assert (
        main(["export", checkpoint.uri, str(adapter), "--adapter", "--cache-dir", str(tmp_path)])
        == 0
    )
    assert "library_name: peft" in (adapter / "README.md").read_text()
    base = transformers.AutoModelForCausalLM.from_pretrained(str(adapter / "base"))
    peft_model = peft.PeftModel.from_pretrained(base, str(adapter))
    ids = torch.tensor([[2, *ByteTokenizer().encode(data_prep.chat_prompt("1+2="))]])
    with torch.no_grad():
        gap = (peft_model(ids).logits - hf(ids).logits).abs().max().item()
    assert gap < 1e-5
    # a merged export into the adapter's directory replaces it whole: no adapter file is left
    # for transformers to apply on top of the merged weights (it would change the logits)
    root = ledger.root(ctx.run_uri)
    again = [*far[:2], str(adapter), *far[3:], "--expect-root", str(root)]
    assert main(again) == 0
    assert sorted(p.name for p in adapter.iterdir()) == sorted(p.name for p in out.iterdir())
    assert not (adapter / "adapter_config.json").exists() and not (adapter / "base").exists()
    with torch.no_grad():
        gap = (
            (
                transformers.AutoModelForCausalLM.from_pretrained(str(adapter))(ids).logits
                - hf(ids).logits
            )
            .abs()
            .max()
            .item()
        )
    assert gap == 0.0
    assert [p.name for p in tmp_path.iterdir() if ".far-export-" in p.name] == []
    assert main(["export", str(tmp_path / "nowhere"), str(tmp_path / "x")]) == EXIT_INVALID
    assert "no committed FAR checkpoint" in capsys.readouterr().err


def check_card(card: str, recipe: Recipe, checkpoint: CheckpointArtifact, run_uri: str) -> None:
    """The model card's front matter and the run facts it states, each from storage."""
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["library_name"] == "transformers" and "sft" in front["tags"]
    assert "license" not in front and "base_model" not in front  # a random-init model has none
    digest = export_card.recipe_digest(recipe.model_dump(mode="json"))
    assert f"- name: `{recipe.name}`" in card and digest in card
    assert "reasoning_gym:basic_arithmetic" in card
    record_uri, record = find_checkpoint_record(checkpoint.uri)
    data_record = storage.read_json(f"{run_uri}/{record.input_artifacts['dataset'].record_uri}")
    for digest in (record.digest, data_record["digest"]):
        assert digest in card
    assert f"Ledger root at export: `{ledger.root(run_uri)}`" in card
    evaluations = read_evaluations(record_uri.rsplit("/", 1)[0])
    for _, evaluation in evaluations:  # written by test_report_files_scores_and_records
        row = f"| {evaluation.evaluation.rsplit('/', 1)[-1]} | "
        assert row + f"{evaluation.scores['accuracy']:.3f} |" in card
    if not evaluations:
        assert "No evaluation of this checkpoint is recorded" in card


def test_checkpoints_also_on_a_timer(tmp_path: Path) -> None:
    """Each step is followed by a CPU-free pause (the stage's progress callback runs between
    steps), so the 1-second timer fires several times within a few steps on any machine."""
    steps_total = 16
    recipe = recipe_with(
        str(tmp_path),
        sft={
            "max_steps": steps_total,
            "checkpoint_every_steps": 1000,
            "checkpoint_every_seconds": 1.0,
        },
    )
    ctx = RunContext(str(tmp_path), "timer")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    paced = dataclasses.replace(ctx, progress=lambda _: time.sleep(0.25))  # >= 4 s of steps
    sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, paced)
    directory = next(Path(tmp_path, "timer").glob("sft-*/checkpoints"))
    # step 1000 never comes: every checkpoint but the final one was the 1-second timer's
    steps = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    assert steps[-1] == steps_total and len(steps) >= 2 and steps[0] < steps_total


class SigtermAfterBatches(StopFlag):
    """A stop flag that reads as set once `after` batches are on storage under `root`: the
    moment a SIGTERM handler would set it, placed deterministically between two batches."""

    def __init__(self, root: str, after: int) -> None:
        super().__init__()
        self.root, self.after = root, after

    def is_set(self) -> bool:
        if len(list(Path(self.root).rglob("progress/*/batch-*.json"))) >= self.after:
            self.request("SIGTERM")
        return super().is_set()


def test_stop_mid_model_resumes_to_the_same_report(trained, tmp_path: Path) -> None:
    recipe, ctx, dataset, checkpoint = trained
    config = recipe.eval.model_copy(
        # no k-shot row: base and sft alone make the batch arithmetic below
        update={
            "models": ["base", "sft"],
            "max_generation_tokens": 16,
            "batch_size": 4,
            "base_shots": 0,
        }
    )
    run = lambda c: evaluate.evaluate(  # noqa: E731
        dataset, {"sft": checkpoint}, config, recipe.model, recipe.mesh, c
    )
    whole = run(RunContext(str(tmp_path / "whole"), "ev", cache_dir=ctx.cache_dir)).output
    stopped = RunContext(
        str(tmp_path / "split"),
        "ev",
        cache_dir=ctx.cache_dir,
        stop=SigtermAfterBatches(str(tmp_path / "split"), 6),
    )
    with pytest.raises(SessionExpired, match=r"evaluation of sft stopped before batch 2"):
        run(stopped)
    kept = sorted(p.name for p in (tmp_path / "split").rglob("progress/*/batch-*.json"))
    assert len(kept) == 6  # base's 4 batches and sft's first 2
    updates: list[ProgressUpdate] = []
    resuming = RunContext(str(tmp_path / "split"), "ev", cache_dir=ctx.cache_dir)
    second = run(dataclasses.replace(resuming, progress=updates.append))
    resumed = second.output
    # progress over both models' 8 batches: the 6 kept ones count as done, 2 are generated
    assert [u.step for u in updates] == list(range(1, 9))
    assert {u.total for u in updates} == {8} and {u.stage for u in updates} == {"evaluate"}
    assert updates[-1].seconds_per_step is not None and updates[5].seconds_per_step is None
    assert resumed.scores == whole.scores
    assert storage.read_bytes(resumed.samples_uri) == storage.read_bytes(whole.samples_uri)
    # the resumed session compiled the sampler once, for the model it still generated with
    metrics = StageRecord.model_validate(storage.read_json(second.record_uri)).metrics
    assert metrics["sft/sampler_prefill_compilations"] == 1
    assert metrics["sft/sampler_decode_compilations"] == 1
    assert metrics["base/sampler_decode_compilations"] == 0  # read back, not generated
