"""deploy/ end to end, as the real story goes: a run starts in a Kaggle session, the TPU VM
deployment's schedule continues it, the next Kaggle session finds it complete.

A real `prefect server start`, both work pools created through the API (the GKE one with
deploy/gke/base-job-template.json, so the server checks the far-gke deployment's job
variables against it), `prefect deploy --all` from deploy/prefect.yaml as the README says, a
real `prefect worker start --type process` subprocess. Then on the smoke recipe, one storage
root: deploy/kaggle/run_session.sh with the smallest budget `far run` accepts (exit 3 with
data-prep committed and the run unfinished; the smoke recipe with longer SFT, each batch
of that session paced by a sleep (tests/e2e/_paced), so that no machine finishes the run
inside that budget and the wait costs no CPU: the plain smoke run fits in it on an idle one),
a far-tpu-vm run through the worker (CPU, through a job-variable override) that skips what
the session committed and ends COMPLETED with every record on storage, and run_session.sh
again (exit 0, all skipped). The three share one run to stay in the CI time budget (each
alone would run the smoke flow).

Nothing runs on GKE here (no cluster, no TPU): only the far-gke registration is exercised.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pipeline.recipes import load_recipe
from schemas.record import StageRecord
from stages.core import storage
from stages.core.sessions import STARTUP_AND_STEP_SECONDS
from tests.conftest import BIN, REPO, prefect_env

pytestmark = pytest.mark.slow
PREFECT = str(BIN / "prefect")
DEPLOY = REPO / "deploy"
KAGGLE = DEPLOY / "kaggle" / "run_session.sh"
RUN_TIMEOUT_S = 600  # the worker's smoke run took up to ~250 s here under heavy load
# The smallest budget leaves STARTUP_AND_STEP_SECONDS (60 s) for start-up and training. The
# first session's `far` sleeps STEP_PACE_S before each SFT batch (tests/e2e/_paced), so its
# LONG_SFT_STEPS steps need more than that in sleep alone on any machine, at no CPU; the
# deployment's run (unpaced) trains the rest at full speed.
PACED = Path(__file__).parent / "_paced"
STEP_PACE_S = 0.4
LONG_SFT_STEPS = 200


@contextmanager
def _api(api_url: str) -> Iterator[Any]:
    """A Prefect client (and settings) for the server at `api_url`."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        yield client


def _pools(api_url: str) -> None:
    """The two pools prefect.yaml targets, as `prefect work-pool create` would make them."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    gke = json.loads((DEPLOY / "gke" / "base-job-template.json").read_text())
    process = ProcessWorker.get_default_base_job_template()
    with _api(api_url) as client:
        client.create_work_pool(
            WorkPoolCreate(name="far-tpu-vm", type="process", base_job_template=process)
        )
        client.create_work_pool(
            WorkPoolCreate(name="far-gke", type="kubernetes", base_job_template=gke)
        )


def _run(cmd: list[str], env: dict[str, str], log: Path) -> None:
    with log.open("w") as out:
        done = subprocess.run(
            cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=180, check=False
        )
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{log.read_text()}"


@pytest.fixture(scope="module")
def deployed(
    prefect_api: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Pools, deployments from deploy/prefect.yaml, and a process worker polling far-tpu-vm."""
    home = tmp_path_factory.mktemp("deploy-home")
    root = tmp_path_factory.mktemp("deploy-root")
    env = prefect_env(home, prefect_api)
    env.update(FAR_STORAGE_ROOT=str(root), FAR_IMAGE="far-tpu:test", PYTHONPATH=str(REPO))
    env.pop("FAR_REPO_DIR", None)  # unset where one deploys: the worker's value is used
    _pools(prefect_api)
    _run(
        [PREFECT, "--no-prompt", "deploy", "--all", "--prefect-file", "deploy/prefect.yaml"],
        env,
        home / "deploy.log",
    )
    _switch_off_schedules(prefect_api)
    # what tpu-vm/startup.sh gives the worker: where the repository is installed
    env.update(
        FAR_REPO_DIR=str(REPO), FAR_CACHE_DIR=str(home / "cache"), PREFECT_WORKER_QUERY_SECONDS="1"
    )
    worker_log = (home / "worker.log").open("w")
    worker = subprocess.Popen(
        [PREFECT, "worker", "start", "--pool", "far-tpu-vm", "--type", "process"],
        env=env,
        cwd=home,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield {
            "api": prefect_api,
            "root": root,
            "run_root": root / "far-runs",
            "env": env,
            "worker": worker,
            "log": home / "worker.log",
        }
    finally:
        os.killpg(worker.pid, 15)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a worker shutting down slowly must not fail a test
            os.killpg(worker.pid, 9)
            worker.wait(timeout=30)
        worker_log.close()


def _switch_off_schedules(api_url: str) -> None:
    """The crons stay registered, inactive: no scheduled TPU run may start during the test
    (one due at the next 6-hour mark would take the deployment's single concurrency slot)."""
    with _api(api_url) as client:
        for name in ("far-tpu-vm", "far-gke"):
            deployment = client.read_deployment_by_name(f"far_scheduled/{name}")
            for schedule in deployment.schedules:
                client.update_deployment_schedule(deployment.id, schedule.id, active=False)


def test_both_deployments_registered_from_the_yaml(deployed: dict[str, Any]) -> None:
    with _api(deployed["api"]) as c:
        tpu_vm = c.read_deployment_by_name("far_scheduled/far-tpu-vm")
        gke = c.read_deployment_by_name("far_scheduled/far-gke")
    assert tpu_vm.work_pool_name == "far-tpu-vm" and gke.work_pool_name == "far-gke"
    assert tpu_vm.parameters["storage_root"] == str(deployed["root"])  # templated at deploy
    assert [s.schedule.cron for s in tpu_vm.schedules] == ["0 */6 * * *"]  # type: ignore[union-attr]
    for deployment in (tpu_vm, gke):  # one run at a time; a run due during another is cancelled
        assert deployment.global_concurrency_limit is not None
        assert deployment.global_concurrency_limit.limit == 1
        assert deployment.concurrency_options is not None
        assert deployment.concurrency_options.collision_strategy == "CANCEL_NEW"
    assert gke.job_variables is not None and gke.job_variables["tpu_topology"] == "2x4"
    assert gke.job_variables["image"] == "far-tpu:test"
    assert tpu_vm.pull_steps == [  # left for the worker's environment to fill in
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $FAR_REPO_DIR }}"}}
    ]


@pytest.fixture(scope="module")
def long_smoke(deployed: dict[str, Any]) -> Path:
    """recipes/smoke.yaml with LONG_SFT_STEPS of SFT, same run name (the recipe every session
    and the deployment run use)."""
    text = (REPO / "recipes" / "smoke.yaml").read_text()
    longer, count = re.subn(r"(?m)^  max_steps: 150$", f"  max_steps: {LONG_SFT_STEPS}", text)
    if count != 1:
        raise ValueError("recipes/smoke.yaml: expected one 'sft: max_steps: 150' line")
    path = deployed["root"] / "smoke-long-sft.yaml"
    path.write_text(longer)
    return path


@pytest.fixture(scope="module")
def kaggle_first_session(deployed: dict[str, Any], long_smoke: Path) -> tuple[int, str]:
    """deploy/kaggle/run_session.sh on the smoke recipe with the smallest session budget
    `far run` accepts (the save margin plus start-up and one step; a smaller one is refused
    before compute): data-prep commits, training stops at the budget before
    the run is complete and the runner exits 3. FAR_VENV is the project's venv (no install)."""
    recipe = load_recipe(str(REPO / "recipes" / "smoke.yaml"))
    margin = max(recipe.sft.save_margin_seconds, recipe.grpo.save_margin_seconds)
    budget = f"{math.ceil(margin + STARTUP_AND_STEP_SECONDS)}s"
    assert LONG_SFT_STEPS * STEP_PACE_S > STARTUP_AND_STEP_SECONDS  # SFT cannot finish in it
    pace = {"PYTHONPATH": f"{PACED}:{REPO}", "FAR_TEST_STEP_PACE_S": str(STEP_PACE_S)}
    return _kaggle_session(budget, deployed, long_smoke, pace)


def _kaggle_session(
    budget: str, deployed: dict[str, Any], recipe: Path, pace: dict[str, str] | None = None
) -> tuple[int, str]:
    env = dict(deployed["env"], FAR_VENV=str(BIN.parent), **(pace or {}))
    done = subprocess.run(
        ["bash", str(KAGGLE), str(recipe), str(deployed["run_root"]), budget],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def _records(deployed: dict[str, Any]) -> dict[str, StageRecord]:
    """The committed stages of the smoke run (those with a stage.json), by stage."""
    run_dir = deployed["run_root"] / "smoke"
    found = [
        f
        for f in storage.list_files(str(run_dir))
        if f.count("/") == 1 and f.endswith("/stage.json")
    ]
    return {
        f.split("-")[0]: StageRecord.model_validate(storage.read_json(str(run_dir / f)))
        for f in found
    }


def test_kaggle_session_stops_at_its_budget(
    kaggle_first_session: tuple[int, str], deployed: dict[str, Any]
) -> None:
    code, out = kaggle_first_session
    assert code == 3, out
    assert "session budget reached; in the next session run this same command" in out
    committed = set(_records(deployed))
    assert "data_prep" in committed and "sft" not in committed, out  # stopped inside SFT


@pytest.fixture(scope="module")
def deployment_run(
    kaggle_first_session: tuple[int, str], deployed: dict[str, Any], long_smoke: Path
) -> tuple[Any, Any]:
    """One far-tpu-vm run through the worker, on the run the Kaggle session left unfinished."""
    from prefect.deployments import run_deployment

    with _api(deployed["api"]):
        run = run_deployment(
            "far_scheduled/far-tpu-vm",
            parameters={
                "recipe_uri": str(long_smoke),
                "storage_root": str(deployed["run_root"]),
                "session_budget": "30m",
            },
            job_variables={"env": {"JAX_PLATFORMS": "cpu"}},  # this machine has no TPU
            timeout=0,
        )
        return run, _wait_for_final_state(run.id, deployed)


def test_worker_runs_the_deployment_and_continues_the_run(
    deployment_run: tuple[Any, Any], deployed: dict[str, Any]
) -> None:
    from prefect.client.schemas.objects import StateType

    run, state = deployment_run
    assert state.type == StateType.COMPLETED, f"{state.name}: {state.message}"
    assert state.name == "Completed"
    records = _records(deployed)
    assert set(records) == {"data_prep", "sft", "grpo", "evaluate"}
    kaggle = records["data_prep"].flow_run_id
    assert kaggle != str(run.id)  # the Kaggle session's, reused
    assert records["evaluate"].flow_run_id == str(run.id)  # the deployment's run
    for stage in ("sft", "grpo"):  # committed by the Kaggle session or by the deployment
        assert records[stage].flow_run_id in (kaggle, str(run.id)), stage


def test_next_kaggle_session_finds_the_run_complete(
    deployment_run: tuple[Any, Any], deployed: dict[str, Any], long_smoke: Path
) -> None:
    code, out = _kaggle_session("8h45m", deployed, long_smoke)
    assert code == 0, out
    assert "run complete" in out
    assert len(re.findall(r"skipped \(already complete\)", out)) == 4, out


def _wait_for_final_state(flow_run_id: Any, deployed: dict[str, Any]) -> Any:
    deadline = time.time() + RUN_TIMEOUT_S
    with _api(deployed["api"]) as client:
        while time.time() < deadline:
            state = client.read_flow_run(flow_run_id).state
            if state is not None and state.is_final():
                return state
            assert deployed["worker"].poll() is None, deployed["log"].read_text()[-3000:]
            time.sleep(2)
    raise TimeoutError(
        f"flow run {flow_run_id} not final in {RUN_TIMEOUT_S} s (state {state}); worker log:\n"
        + deployed["log"].read_text()[-3000:]
    )
