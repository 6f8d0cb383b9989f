"""Multi-host discipline with two CPU processes joined by jax.distributed (gloo collectives),
the tiny model on an fsdp=2 mesh spanning both: SFT stops (a stop request reaching one
process only) and resumes; GRPO and evaluation run across both processes (Tunix's reported
multi-process sampler failure, google/tunix#698, does not occur here); only process 0
writes records."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from schemas.record import StageRecord
from stages.core import storage
from stages.core.evaluations import read_evaluations
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def two_processes(root: Path, stage: str, max_steps: int) -> list[dict[str, Any]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    arguments = lambda i: [str(port), str(i), str(root), stage, str(max_steps)]  # noqa: E731
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.integration._multihost_child", *arguments(i)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (0, 1)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def test_two_processes_stop_resume_reinforce_evaluate_and_only_process_0_writes(
    tmp_path: Path,
) -> None:
    first = two_processes(tmp_path, "sft", -6)
    assert [r["outcome"] for r in first] == ["stopped", "stopped"]
    assert first[0]["detail"] == first[1]["detail"]  # both at the same step
    assert "SFT stopped at step" in first[0]["detail"] and "of 6" in first[0]["detail"]
    assert all(r["devices"] == 2 for r in first)
    second = two_processes(tmp_path, "continue", 6)
    assert [r["outcome"] for r in second] == ["complete", "complete"]
    assert second[0]["sft_step"] == second[1]["sft_step"] == 6
    assert second[0]["grpo_step"] == second[1]["grpo_step"] == 2
    assert second[0]["scores"] == second[1]["scores"]  # one program, one answer
    assert [s["name"] for s in second[0]["scores"]] == ["sft", "grpo"]
    sft = StageRecord.model_validate(storage.read_json(second[0]["sft_record"]))
    assert sft.hardware.process_count == 2
    # one note per session: process 1 never wrote one
    assert [s.outcome for s in sft.sessions] == ["stopped", "complete"]
    grpo = StageRecord.model_validate(storage.read_json(second[0]["grpo_record"]))
    assert grpo.hardware.process_count == 2 and [s.outcome for s in grpo.sessions] == ["complete"]
    for record in (second[0]["sft_record"], second[0]["grpo_record"]):
        [(_, evaluation)] = read_evaluations(record.rsplit("/", 1)[0])
        assert evaluation.evaluation == second[0]["eval_record"].rsplit("/", 1)[0]
