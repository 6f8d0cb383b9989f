"""The TPU recipes' own stage settings, trained on CPU: each recipe scaled to the tiny model
(tests/scaled_recipes.py: model, data, step counts and generation lengths replaced, nothing
else) runs data_prep -> sft -> grpo -> evaluate on as many CPU devices as its mesh names.

What the TPU runs and no other test trains: gradient accumulation 8, packed rows, GRPO
micro-batches of 2 prompts, bfloat16 (it trains on this CPU), fsdp 8 (the Kaggle recipe) and
16 (the v5e16 recipe; the v5e8 one is the same recipe at fsdp 8, pinned by
tests/unit/test_scaled_recipes.py, so it is not trained a third time). Checked: every
stage completes; the SFT train step, the GRPO train step and rollout sampler, and the
evaluation sampler of each model compile exactly once per session, a resumed session
included; a stop requested inside an accumulation window, and a kill -9 in GRPO with
num_iterations 2, each resume to bitwise the parameters of an uninterrupted run (the Kaggle
full run's: its GRPO takes num_iterations 2; FULL_RUN_CHANGES says what each full run changes
on top of the scaling, and why).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from schemas.record import StageRecord
from stages import sft
from stages.core import storage
from stages.core.datasets import load_sft_arrays
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.modeling import models, tunix_compat
from tests.conftest import REPO, recipe_with
from tests.integration._tpu_recipe_child import EXIT_SESSION_ENDED
from tests.integration.test_sft_full import lora_leaves
from tests.scaled_recipes import (
    SFT_CHECKPOINT_EVERY,
    SFT_STEPS,
    STOP_RECIPE,
    TRAINED_RECIPES,
    devices_needed,
    evaluated_rows,
)
from tests.scaled_recipes import full_run as scaled_full_run

pytestmark = pytest.mark.slow
KAGGLE = STOP_RECIPE  # the stop and kill tests' recipe
PARTS = ("prefill", "decode")
TIMEOUT = 900  # seconds per child; a full run takes ~2-4 min on 2 busy cores

Records = dict[str, str]  # stage -> its record's URI


def start_child(name: str, root: Path, cache: str, mode: str, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(REPO),
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_needed(name)}",
    }
    command = ["-m", "tests.integration._tpu_recipe_child", mode, name, str(root), cache, *args]
    return subprocess.Popen(
        [sys.executable, *command],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(child: subprocess.Popen[str], expected: int = 0) -> dict[str, str]:
    """Wait for the child; the URIs of its stage records by stage name."""
    output = child.communicate(timeout=TIMEOUT)[0]
    assert child.returncode == expected, output[-5000:]
    lines = [line.split(" ", 2) for line in output.splitlines() if line.startswith("RECORD ")]
    return {stage: uri for _, stage, uri in lines}


def read(uri: str) -> StageRecord:
    return StageRecord.model_validate(storage.read_json(uri))


@pytest.fixture(scope="module")
def full_run(
    tmp_path_factory: pytest.TempPathFactory, compilation_cache: str
) -> Callable[[str], tuple[Records, Path]]:
    """A recipe's four stages, run once per test module: (records by stage, root)."""
    done: dict[str, tuple[Records, Path]] = {}

    def run(name: str) -> tuple[Records, Path]:
        if name not in done:
            root = tmp_path_factory.mktemp(name)
            done[name] = (finish(start_child(name, root, compilation_cache, "full")), root)
        return done[name]

    return run


def test_tunix_alone_checkpoints_a_half_accumulated_window(tmp_path: Path) -> None:
    """Why the stream stops between windows only: a stream that ends inside a window makes
    Tunix's trainer save, in close(), its optimizer state with the window half accumulated
    under the last whole update's step; a resume re-reads that window from its start and so
    would accumulate those micro-batches twice. (Tiny smoke model, accumulation 4.)"""
    recipe = recipe_with(
        str(tmp_path),
        sft={"max_steps": 3, "gradient_accumulation_steps": 4, "checkpoint_every_steps": 2},
    )
    ctx = RunContext(str(tmp_path), "r")
    arrays = load_sft_arrays(data_prep.prepare(recipe.data, recipe.model, ctx).output)
    mesh = models.build_mesh(recipe.mesh)

    def trainer() -> sft.peft_trainer.PeftTrainer:
        base = models.build_base_model(recipe.model, mesh, ctx.model_cache)
        model = models.apply_lora(base, recipe.sft.lora, mesh, recipe.sft.seed)  # type: ignore[arg-type]
        keep = tunix_compat.loss_positions(arrays["input_mask"])
        return sft.build_trainer(
            model, recipe.sft, str(tmp_path / "ck"), str(tmp_path / "tb"), keep
        )

    first = trainer()
    with mesh:  # one window of 4 micro-batches and 2 of the next, then the data ends
        first.train(itertools.islice(iter(sft.batches(arrays, recipe.sft.batch_size, 0)), 6))
    assert first.train_steps == 1
    restored = trainer()
    assert restored.train_steps == 1  # resumes "at update 1", skipping 4 micro-batches ...
    state = restored.optimizer.opt_state
    assert int(np.asarray(state.mini_step.value)) == 2  # ... with 2 already accumulated


def test_a_stop_inside_an_accumulation_window_resumes_bitwise(
    tmp_path: Path, full_run: Callable[[str], tuple[Records, Path]], compilation_cache: str
) -> None:
    reference, _ = full_run(KAGGLE)
    dataset = reference["data_prep"]
    # a stop requested after 11 micro-batches: the first window (8) and 3 of the second
    first = start_child(KAGGLE, tmp_path, compilation_cache, "sft", dataset, "--stop-after", "11")
    output = first.communicate(timeout=TIMEOUT)[0]
    assert first.returncode == EXIT_SESSION_ENDED, output[-5000:]
    # the window in progress was finished: the stop took effect after update 2, not 1
    assert f"SFT stopped at step 2 of {SFT_STEPS}" in output
    saved = sorted(
        int(p.name) for p in tmp_path.glob("child/sft-*/checkpoints/*") if p.name.isdigit()
    )
    assert saved == [SFT_CHECKPOINT_EVERY] == [2]
    resumed = finish(start_child(KAGGLE, tmp_path, compilation_cache, "sft", dataset))
    record = read(resumed["sft"])
    assert record.metrics["resumed_from_step"] == 2
    assert record.metrics["train_step_compilations"] == 1
    expected = lora_leaves(read(reference["sft"]).output)  # type: ignore[arg-type]
    got = lora_leaves(record.output)  # type: ignore[arg-type]
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


def test_kill_9_in_grpo_with_two_iterations_resumes_bitwise(
    tmp_path: Path, full_run: Callable[[str], tuple[Records, Path]], compilation_cache: str
) -> None:
    reference, _ = full_run(KAGGLE)  # its GRPO: num_iterations 2, uninterrupted
    uninterrupted = read(reference["grpo"])
    assert uninterrupted.config["grpo"]["num_iterations"] == 2
    args = (reference["data_prep"], reference["sft"], "--num-iterations", "2")
    victim = start_child(KAGGLE, tmp_path, compilation_cache, "grpo", *args)
    actor = tmp_path / "child"
    deadline = time.time() + TIMEOUT
    # Tunix numbers checkpoints by optimizer update: update 2 ends GRPO step 1 of 3
    while not list(actor.glob("grpo-*/checkpoints/actor/2")):
        assert victim.poll() is None, "finished before it could be killed"
        assert time.time() < deadline, "no GRPO checkpoint appeared"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not list(actor.glob("grpo-*/stage.json"))  # not committed
    resumed = start_child(KAGGLE, tmp_path, compilation_cache, "grpo", *args)
    record = read(finish(resumed)["grpo"])
    assert record.stage_hash == uninterrupted.stage_hash  # the same stage, settings and inputs
    assert 1 <= record.metrics["resumed_from_step"] < 3
    assert record.metrics["train_step_compilations"] == 1  # the resumed session compiled once
    assert record.metrics["rollout_decode_compilations"] == 1
    expected = lora_leaves(uninterrupted.output)  # type: ignore[arg-type]
    got = lora_leaves(record.output)  # type: ignore[arg-type]
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
    # GRPO moved the adapters through the data: the rewards are all 0 on this untrained
    # model, but the KL term (beta 0.04; the policy is away from the reference after SFT)
    # has a gradient that depends on the prompts and completions, so a resume at the wrong
    # prompts would not match. One KL value per optimizer update: num_iterations 2 x 3 steps.
    kl = uninterrupted.history["kl"]
    assert len(kl) == 6 and all(np.isfinite(kl)) and any(x != 0 for x in kl)
    start = lora_leaves(read(reference["sft"]).output)  # type: ignore[arg-type]
    assert any(not np.array_equal(a, b) for a, b in zip(start, expected, strict=True))


@pytest.mark.parametrize("name", TRAINED_RECIPES)
def test_a_tpu_recipe_runs_all_four_stages_compiling_each_step_once(
    name: str, full_run: Callable[[str], tuple[Records, Path]]
) -> None:
    uris, _ = full_run(name)
    assert list(uris) == ["data_prep", "sft", "grpo", "evaluate"]
    records = {stage: read(uri) for stage, uri in uris.items()}
    assert all(r.status == "complete" for r in records.values())
    arrays = load_sft_arrays(records["data_prep"].output)  # type: ignore[arg-type]
    assert arrays["segment_ids"].max() > 1  # packed: rows hold several examples
    sft, grpo, evaluation = (records[s].metrics for s in ("sft", "grpo", "evaluate"))
    assert sft["rows_per_step"] == 16 * 8  # micro-batch 16, accumulation 8
    assert sft["train_step_compilations"] == 1
    assert grpo["train_step_compilations"] == 1
    assert grpo["rollout_prefill_compilations"] == grpo["rollout_decode_compilations"] == 1
    rows = evaluated_rows(scaled_full_run(name, "/unused"))
    assert rows == (["base", "base-3shot", "sft", "grpo"] if name == KAGGLE else ["grpo"])
    compiled = {k: v for k, v in evaluation.items() if "/sampler_" in k}
    assert compiled == {f"{row}/sampler_{part}_compilations": 1 for row in rows for part in PARTS}
