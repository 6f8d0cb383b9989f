"""deploy/prefect.yaml end to end: a real `prefect server start`, both work pools created
through the API (the GKE one with deploy/gke/base-job-template.json, so the server checks the
far-gke deployment's job variables against it), `prefect deploy --all` from the yaml as the
README says, a real `prefect worker start --type process` subprocess, one run of the far-tpu-vm
deployment on the smoke recipe (CPU, through a job-variable override), COMPLETED with its
stage records on storage.

Nothing runs on GKE here (no cluster, no TPU): only the far-gke registration is exercised.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas.record import StageRecord
from stages import storage
from tests.conftest import REPO, prefect_env

pytestmark = pytest.mark.slow
PREFECT = str(REPO / ".venv" / "bin" / "prefect")
DEPLOY = REPO / "deploy"
RUN_TIMEOUT_S = 300


def _pools(api_url: str) -> None:
    """The two pools prefect.yaml targets, as `prefect work-pool create` would make them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.workers.process import ProcessWorker

    gke = json.loads((DEPLOY / "gke" / "base-job-template.json").read_text())
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(
            name="far-tpu-vm", type="process",
            base_job_template=ProcessWorker.get_default_base_job_template()))  # fmt: skip
        client.create_work_pool(
            WorkPoolCreate(name="far-gke", type="kubernetes", base_job_template=gke)
        )


def _run(cmd: list[str], env: dict[str, str], log: Path) -> None:
    with log.open("w") as out:
        done = subprocess.run(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                              timeout=180, check=False)  # fmt: skip
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
    _run([PREFECT, "--no-prompt", "deploy", "--all", "--prefect-file", "deploy/prefect.yaml"],
         env, home / "deploy.log")  # fmt: skip
    # what tpu-vm/startup.sh gives the worker: where the repository is installed
    env.update(FAR_REPO_DIR=str(REPO), FAR_CACHE_DIR=str(home / "cache"),
               PREFECT_WORKER_QUERY_SECONDS="1")  # fmt: skip
    worker_log = (home / "worker.log").open("w")
    worker = subprocess.Popen(
        [PREFECT, "worker", "start", "--pool", "far-tpu-vm", "--type", "process"],
        env=env, cwd=home, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield {"api": prefect_api, "root": root, "worker": worker, "log": home / "worker.log"}
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(timeout=60)
        worker_log.close()


def _client(api_url: str) -> Any:
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def test_both_deployments_registered_from_the_yaml(deployed: dict[str, Any]) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: deployed["api"]}), _client(deployed["api"]) as c:
        tpu_vm = c.read_deployment_by_name("far_scheduled/far-tpu-vm")
        gke = c.read_deployment_by_name("far_scheduled/far-gke")
    assert tpu_vm.work_pool_name == "far-tpu-vm" and gke.work_pool_name == "far-gke"
    assert tpu_vm.parameters["storage_root"] == str(deployed["root"])  # templated at deploy
    assert [s.schedule.cron for s in tpu_vm.schedules] == ["0 */6 * * *"]  # type: ignore[union-attr]
    assert gke.job_variables is not None and gke.job_variables["tpu_topology"] == "2x4"
    assert gke.job_variables["image"] == "far-tpu:test"
    assert tpu_vm.pull_steps == [  # left for the worker's environment to fill in
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $FAR_REPO_DIR }}"}}
    ]


def test_worker_runs_the_tpu_vm_deployment_to_completion(deployed: dict[str, Any]) -> None:
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    root = deployed["root"] / "smoke-run"
    with temporary_settings({PREFECT_API_URL: deployed["api"]}):
        run = run_deployment(
            "far_scheduled/far-tpu-vm",
            parameters={"recipe_uri": "recipes/smoke.yaml", "storage_root": str(root),
                        "session_budget": "30m"},
            job_variables={"env": {"JAX_PLATFORMS": "cpu"}},  # this machine has no TPU
            timeout=0,
        )  # fmt: skip
        state = _wait_for_final_state(run.id, deployed)
    assert state.type == StateType.COMPLETED, f"{state.name}: {state.message}"
    assert state.name == "Completed"
    for stage in ("data_prep", "sft", "grpo", "evaluate"):
        [record_uri] = [f for f in storage.list_files(str(root / "smoke"))
                        if f.startswith(f"{stage}-") and f.count("/") == 1
                        and f.endswith("/stage.json")]  # fmt: skip
        record = StageRecord.model_validate(storage.read_json(str(root / "smoke" / record_uri)))
        assert record.flow_run_id == str(run.id)  # the deployment's flow run did the work


def _wait_for_final_state(flow_run_id: Any, deployed: dict[str, Any]) -> Any:
    deadline = time.time() + RUN_TIMEOUT_S
    with _client(deployed["api"]) as client:
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
