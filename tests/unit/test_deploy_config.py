"""deploy/: every deployment in prefect.yaml resolves to the flow, its parameters validate
against the flow's parameter schema and its recipe loads; schedules parse; the GKE base job
template has the TPU selector and resources and the shape Prefect's Kubernetes worker needs;
the scripts parse; the Dockerfile copies files that exist.

We cannot run GKE, a TPU VM or Kaggle here: the Kubernetes checks render the template with
Prefect's own templating and hold it to the rules prefect-kubernetes' worker validates (it is
not installed); tests/e2e runs the far-tpu-vm deployment for real on a process worker.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from typing import Any

import pytest
import yaml

from pipeline.plan import plan_run
from tests.conftest import REPO

DEPLOY = REPO / "deploy"
PREFECT_YAML = yaml.safe_load((DEPLOY / "prefect.yaml").read_text())
DEPLOYMENTS = {d["name"]: d for d in PREFECT_YAML["deployments"]}
GKE_TEMPLATE = json.loads((DEPLOY / "gke" / "base-job-template.json").read_text())
TEST_ENV = {"FAR_STORAGE_ROOT": "gs://far-test-bucket/far", "FAR_IMAGE": "far-tpu:test"}


def rendered(deployment: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The deployment as `prefect deploy` fills it in from the environment."""
    from prefect.utilities.templating import apply_values

    for key, value in TEST_ENV.items():
        monkeypatch.setenv(key, value)
    return apply_values(deployment, {}, remove_notset=False)


def test_the_yaml_has_the_deployments_and_pull_step() -> None:
    assert set(DEPLOYMENTS) >= {"far-tpu-vm", "far-gke"}
    assert PREFECT_YAML["pull"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $FAR_REPO_DIR }}"}}
    ]
    for name in ("far-tpu-vm", "far-gke"):
        assert DEPLOYMENTS[name]["work_pool"]["name"] == name


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_entrypoint_is_a_flow_and_parameters_validate(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect import Flow
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate

    deployment = rendered(DEPLOYMENTS[name], monkeypatch)
    path, function = deployment["entrypoint"].split(":")
    flow = load_flow_from_entrypoint(f"{REPO / path}:{function}")
    assert isinstance(flow, Flow) and flow.name == "far_scheduled"
    parameters = deployment["parameters"]
    validate(parameters, parameter_schema(flow).model_dump(), raise_on_error=True)
    assert parameters["storage_root"] == TEST_ENV["FAR_STORAGE_ROOT"]
    plan = plan_run(
        str(REPO / parameters["recipe_uri"]),
        parameters["storage_root"],
        session_budget=parameters["session_budget"],
    )
    assert plan.root == TEST_ENV["FAR_STORAGE_ROOT"]
    assert plan.recipe.session_budget is not None and plan.deadline is not None


def test_no_two_deployments_write_the_same_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """concurrency_limit is per deployment: two deployments on one storage root and run name
    would be two writers on one run (the run lease would refuse the later one every time)."""
    runs: dict[str, str] = {}
    for name, deployment in sorted(DEPLOYMENTS.items()):
        parameters = rendered(deployment, monkeypatch)["parameters"]
        plan = plan_run(
            str(REPO / parameters["recipe_uri"]), parameters["storage_root"], parameters.get("name")
        )
        run_uri = f"{plan.root}/{plan.recipe.name}"
        assert run_uri not in runs, f"{name} and {runs.get(run_uri)} both write {run_uri}"
        runs[run_uri] = name


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_schedules_parse_and_runs_do_not_overlap(name: str) -> None:
    from prefect.client.schemas.schedules import CronSchedule

    deployment = DEPLOYMENTS[name]
    for spec in deployment["schedules"]:
        schedule = CronSchedule(cron=spec["cron"], timezone=spec["timezone"])
        assert schedule.cron == spec["cron"]
    assert deployment["concurrency_limit"]["limit"] == 1  # two runs would share storage


def test_unrendered_templates_are_refused_by_name() -> None:
    from flows.deployment import reject_unrendered_templates

    with pytest.raises(ValueError, match=r"storage_root is an unrendered template"):
        reject_unrendered_templates({"recipe_uri": "r.yaml", "storage_root": "{{ $X }}"})
    reject_unrendered_templates({"recipe_uri": "r.yaml", "storage_root": None})


def test_process_job_variables_fit_the_process_worker() -> None:
    from prefect.utilities.schema_tools import validate
    from prefect.workers.process import ProcessWorker

    schema = ProcessWorker.get_default_base_job_template()["variables"]
    job_variables = DEPLOYMENTS["far-tpu-vm"]["work_pool"]["job_variables"]
    validate(job_variables, schema, raise_on_error=True, ignore_required=True)
    assert job_variables["env"]["JAX_PLATFORMS"] == "tpu"


def _render_gke(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """job_configuration filled in as a worker does: defaults < deployment's job variables."""
    from prefect.utilities.templating import apply_values

    properties = GKE_TEMPLATE["variables"]["properties"]
    values = {k: v["default"] for k, v in properties.items() if "default" in v}
    values.update(rendered(DEPLOYMENTS["far-gke"], monkeypatch)["work_pool"]["job_variables"])
    values.update(name="far-run", command="prefect flow-run execute", labels={})
    return apply_values(GKE_TEMPLATE["job_configuration"], values)


def test_gke_template_is_a_valid_base_job_template(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.server.schemas.actions import validate_base_job_template
    from prefect.utilities.schema_tools import validate

    validate_base_job_template(GKE_TEMPLATE)  # every placeholder is a declared variable
    job_variables = rendered(DEPLOYMENTS["far-gke"], monkeypatch)["work_pool"]["job_variables"]
    validate(job_variables, GKE_TEMPLATE["variables"], raise_on_error=True, ignore_required=True)
    # the fields KubernetesWorkerJobConfiguration reads
    assert set(GKE_TEMPLATE["job_configuration"]) >= {
        "command",
        "env",
        "labels",
        "name",
        "namespace",
        "job_manifest",
    }


def test_gke_job_lands_on_the_tpu_node_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _render_gke(monkeypatch)
    manifest = config["job_manifest"]
    pod = manifest["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x4",
    }
    [container] = pod["containers"]
    assert container["resources"]["limits"]["google.com/tpu"] == 8
    assert container["resources"]["requests"]["google.com/tpu"] == 8
    assert container["image"] == TEST_ENV["FAR_IMAGE"]
    assert container["env"]["JAX_PLATFORMS"] == "tpu"
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in (
        pod["tolerations"]
    )
    # what prefect-kubernetes' worker requires of a job manifest (_get_base_job_manifest)
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    assert (pod["parallelism"], pod["completions"], pod["restartPolicy"]) == (1, 1, "Never")
    assert container["name"] == "prefect-job"
    assert config["namespace"] == manifest["metadata"]["namespace"] == "far"


@pytest.mark.parametrize(
    "script", ["install.sh", "tpu-vm/startup.sh", "tpu-vm/slice-run.sh", "kaggle/run_session.sh"]
)
def test_scripts_parse(script: str) -> None:
    path = DEPLOY / script
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert path.read_text().startswith("#!/usr/bin/env bash\n")
    assert path.stat().st_mode & 0o111, f"{script} is not executable"


def test_dockerfile_copies_files_that_exist() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    sources = [
        src
        for line in re.findall(r"^COPY (.+)$", text, re.M)
        for src in line.split()[:-1]  # the last word is the destination
    ]
    assert "requirements.lock" in sources and "deploy/install.sh" in sources
    missing = [s for s in sources if not (REPO / s).exists()]
    assert not missing, f"Dockerfile copies what the repository does not have: {missing}"
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    absent = [p for p in packages["root_packages"] if p not in sources]
    assert not absent, f"the image would lack FAR packages: {absent}"
    assert "install.sh /opt/far-venv tpu" in text  # the TPU extra


def test_install_script_skips_only_torch_from_the_lock() -> None:
    lock = (REPO / "requirements.lock").read_text().splitlines()
    kept = [line for line in lock if not re.match(r"^torch==", line)]
    assert len(lock) - len(kept) == 1  # torch (a +cpu build) and nothing else is left out
    assert "grep -v '^torch==' " in (DEPLOY / "install.sh").read_text()


def test_readme_names_every_file() -> None:
    readme = (DEPLOY / "README.md").read_text()
    for name in [
        "prefect.yaml",
        "tpu-vm/startup.sh",
        "gke/base-job-template.json",
        "kaggle/run_session.sh",
        "Dockerfile",
        "install.sh",
        "tpu-vm/slice-run.sh",
        "gke/multihost-job.yaml",
    ]:
        assert name in readme, name


# --- multi-host: a TPU VM slice and a GKE multi-host job, every host running the same run ---

MULTIHOST_RECIPE = "recipes/tpu-gemma3-1b-v5e16-multihost.yaml"
CHIPS_PER_V5E_HOST = 4  # a v5e multi-host slice: 4 chips per host (tpu-v5-lite-podslice)


def test_multihost_recipe_is_the_single_host_one_on_a_larger_mesh() -> None:
    """Its run continues GRPO and evaluation on one v5e-8 host with the v5e-8 recipe and
    --name: the two recipes may differ only in what is never drift."""
    from stages.core import drift

    multi = plan_run(str(REPO / MULTIHOST_RECIPE), "gs://b/far").recipe
    single = plan_run(str(REPO / "recipes/tpu-gemma3-1b-v5e8.yaml"), "gs://b/far").recipe
    assert multi.mesh.fsdp * multi.mesh.tp == 16
    changes = drift.recipe_changes(single.model_dump(mode="json"), multi.model_dump(mode="json"))
    assert changes == []


def multihost_documents() -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all((DEPLOY / "gke" / "multihost-job.yaml").read_text())
    return {d["kind"]: d for d in docs}


def test_gke_multihost_job_runs_the_same_distributed_command_on_every_host() -> None:
    from flows.cli import build_parser

    docs = multihost_documents()
    job, service = docs["Job"], docs["Service"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    hosts = spec["completions"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == hosts
    assert pod["subdomain"] == service["metadata"]["name"]  # the pods find each other by DNS
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    [container] = pod["containers"]
    chips = container["resources"]["limits"]["google.com/tpu"]
    assert chips == container["resources"]["requests"]["google.com/tpu"] == CHIPS_PER_V5E_HOST
    x, y = map(int, pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"].split("x"))
    assert x * y == hosts * chips
    command = container["command"]
    assert command[0] == "far"
    args = build_parser().parse_args(command[1:])
    assert args.distributed and args.recipe == MULTIHOST_RECIPE
    recipe = plan_run(str(REPO / args.recipe), "gs://b/far").recipe
    assert recipe.mesh.fsdp * recipe.mesh.tp == hosts * chips


def test_slice_script_runs_far_on_every_worker() -> None:
    from flows.cli import build_parser

    text = (DEPLOY / "tpu-vm" / "slice-run.sh").read_text()
    assert "--worker=all" in text
    [line] = re.findall(r"/opt/far-venv/bin/far (run .+--distributed)", text)
    recipe = re.search(r"^recipe=(\S+)$", text, re.M)
    assert recipe is not None and (REPO / recipe.group(1)).exists()
    words = line.replace("$recipe", recipe.group(1)).replace("'", "").split()
    args = build_parser().parse_args(words)
    assert args.distributed and args.recipe == MULTIHOST_RECIPE
