"""The Prefect UI, end to end: a real `prefect server start`, the smoke recipe's flow run twice
on it (the session's `smoke_twice`: the second run skips all four stages), and headless Debian
chromium on the UI's pages. (`far run` as a process is exercised by test_sigterm_resume.py,
test_prefect_outage.py and the deployment test's Kaggle sessions.)

Checks what a person watching the run would see: the four stage task runs, their keyed
artifacts (metrics table, data card, evaluation report, checkpoint links) and, on the second
run, every stage shown as Skipped; and the run graph of recipes/smoke-dag.yaml (the session's
`dag_run` on the same server), one task run per DAG node. Screenshots go to test-outputs/ui/
in the repository.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from flows.ui_artifacts import artifact_key, run_label
from tests.conftest import REPO, SmokeRuns

pytestmark = pytest.mark.slow
STAGES = ["data_prep", "sft", "grpo", "evaluate"]
CHROMIUM = os.environ.get("FAR_CHROMIUM") or next(
    filter(None, (shutil.which(name) for name in ("chromium", "chromium-browser"))), None
)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = REPO / "test-outputs" / "ui"
EXPECTED_KEYS = {
    "data_prep": {"summary", "metrics", "data-card"},
    "sft": {"summary", "metrics", "checkpoint"},
    "grpo": {"summary", "metrics", "checkpoint"},
    "evaluate": {"summary", "metrics", "report"},
}
UI_TIMEOUT_MS = 60_000


def expected_keys(trained: bool) -> dict[str, set[str]]:
    """EXPECTED_KEYS, plus the progress artifact sft, grpo and evaluate keep while they run (a
    run that skips them creates none)."""
    progress = {"sft", "grpo", "evaluate"} if trained else set()
    return {s: k | ({"progress"} if s in progress else set()) for s, k in EXPECTED_KEYS.items()}


@dataclass(frozen=True)
class Runs:
    api_url: str
    first: str  # flow run id of the run that trained
    second: str  # flow run id of the re-run that skipped every stage
    label: str  # the run's label in keys: `smoke-{id}` (flows.ui_artifacts.run_label)

    @property
    def ui_url(self) -> str:
        return self.api_url.removesuffix("/api")


def _api(api_url: str, path: str, body: dict[str, Any]) -> Any:
    response = httpx.post(f"{api_url}/{path}", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


@pytest.fixture(scope="module")
def runs(smoke_twice: SmokeRuns) -> Runs:
    """The session's two smoke runs on the real server (shared with test_smoke_flow.py)."""
    label = run_label("smoke", smoke_twice.first.run_uri)
    return Runs(smoke_twice.api_url, smoke_twice.first_id, smoke_twice.second_id, label)


def _task_runs(runs: Runs, flow_run_id: str) -> dict[str, dict[str, Any]]:
    body = {"flow_runs": {"id": {"any_": [flow_run_id]}}}
    return {t["name"].rsplit("-", 1)[0]: t for t in _api(runs.api_url, "task_runs/filter", body)}


def _artifacts(runs: Runs, flow_run_id: str) -> list[dict[str, Any]]:
    body = {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}
    return list(_api(runs.api_url, "artifacts/filter", body))


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Debian chromium (never a downloaded browser) with a fresh profile."""
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:
        pytest.skip(
            "SKIPPED the Prefect UI browser test: no chromium found (FAR_CHROMIUM, chromium, "
            "chromium-browser on PATH); `make browser` installs Debian chromium as root"
        )
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            args=CHROMIUM_FLAGS,
            headless=True,
            viewport={"width": 1600, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


def _screenshot(page: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def test_task_runs_end_completed_then_skipped(runs: Runs) -> None:
    first, second = _task_runs(runs, runs.first), _task_runs(runs, runs.second)
    assert sorted(first) == sorted(STAGES) and sorted(second) == sorted(STAGES)
    for stage in STAGES:
        assert (first[stage]["state_type"], first[stage]["state_name"]) == (
            "COMPLETED",
            "Completed",
        ), stage
        assert (second[stage]["state_type"], second[stage]["state_name"]) == (
            "COMPLETED",
            "Skipped",
        ), stage


def test_each_stage_publishes_its_keyed_artifacts(runs: Runs) -> None:
    """Each stage's task run publishes its keyed artifacts; the flow run itself publishes the
    run's ledger root (no task run)."""
    for flow_run_id in (runs.first, runs.second):
        tasks = {t["id"]: name for name, t in _task_runs(runs, flow_run_id).items()}
        keys: dict[str, set[str]] = {stage: set() for stage in STAGES}
        artifacts = _artifacts(runs, flow_run_id)
        (ledger,) = [a for a in artifacts if a["task_run_id"] is None]
        assert ledger["key"] == artifact_key(runs.label, "run", "ledger")
        assert "ledger root sha256:" in ledger["description"]
        for artifact in artifacts:
            if artifact["task_run_id"] is None:
                continue
            stage = tasks[artifact["task_run_id"]]
            prefix = f"far-{runs.label}-{stage.replace('_', '-')}-"
            assert artifact["key"].startswith(prefix), artifact["key"]
            keys[stage].add(artifact["key"].removeprefix(prefix))
        assert keys == expected_keys(trained=flow_run_id == runs.first)


def test_artifact_contents(runs: Runs) -> None:
    by_key = {a["key"]: a for a in _artifacts(runs, runs.first)}
    sft_metrics = {row["metric"]: row["value"] for row in _table(by_key[_key(runs, "sft-metrics")])}
    assert sft_metrics["status"] == "ran"
    assert sft_metrics["train_step_compilations"] == 1.0
    link = by_key[_key(runs, "sft-checkpoint")]["data"]  # a link artifact is stored as markdown
    assert "](file://" in link and "/smoke/sft-" in link and "step 150" in link
    report = by_key[_key(runs, "evaluate-report")]["data"]
    assert "| model | prompts | format rate [95% CI] |" in report
    assert "| sft |" in report
    assert "| split | examples |" in by_key[_key(runs, "data-prep-data-card")]["data"]
    skipped = {a["key"]: a for a in _artifacts(runs, runs.second)}
    rows = {row["metric"]: row["value"] for row in _table(skipped[_key(runs, "sft-metrics")])}
    assert rows["status"] == "skipped (complete on storage)"
    assert rows["train_step_compilations"] == 1.0  # the skipped stage shows the recorded run


def _key(runs: Runs, stage_and_what: str) -> str:
    """The run's key for e.g. "sft-metrics": `far-smoke-{id}-sft-metrics`."""
    return f"far-{runs.label}-{stage_and_what}"


def _table(artifact: dict[str, Any]) -> list[dict[str, Any]]:
    assert artifact["type"] == "table", artifact
    data = artifact["data"]
    return list(json.loads(data) if isinstance(data, str) else data)


def _open_tab(page: Any, runs: Runs, flow_run_id: str, tab: str) -> None:
    page.goto(f"{runs.ui_url}/runs/flow-run/{flow_run_id}")
    page.locator("li.p-tab", has_text=tab).click()


def _check_task_list(page: Any, runs: Runs, flow_run_id: str, state: str) -> None:
    """The Task Runs tab lists data_prep, sft, grpo and evaluate, each with its state badge."""
    from playwright.sync_api import expect

    _open_tab(page, runs, flow_run_id, "Task Runs")
    for stage in STAGES:
        link = page.locator("a.p-link", has_text=re.compile(rf"^{stage}-[0-9a-f]+$"))
        row = page.locator(".state-list-item", has=link)
        expect(row).to_have_count(1, timeout=UI_TIMEOUT_MS)
        expect(row.locator(".state-badge")).to_have_text(state)


def _check_artifact_cards(page: Any, runs: Runs, flow_run_id: str) -> None:
    from playwright.sync_api import expect

    _open_tab(page, runs, flow_run_id, "Artifacts")
    titles = page.locator(".artifact-card__title")
    expected = sorted(
        [
            artifact_key(runs.label, stage, what)
            for stage, whats in expected_keys(trained=flow_run_id == runs.first).items()
            for what in whats
        ]
        + [artifact_key(runs.label, "run", "ledger")]
    )
    expect(titles).to_have_count(len(expected), timeout=UI_TIMEOUT_MS)
    assert sorted(titles.all_inner_texts()) == expected


def test_ui_shows_the_run_its_stages_and_artifacts(runs: Runs, browser: Any) -> None:
    from playwright.sync_api import expect

    page = browser.new_page()
    page.goto(f"{runs.ui_url}/runs/flow-run/{runs.first}")
    expect(page.get_by_text("4 Task runs").first).to_be_visible(timeout=UI_TIMEOUT_MS)
    page.locator("canvas").first.wait_for(timeout=UI_TIMEOUT_MS)  # the run graph
    page.wait_for_timeout(2000)  # the graph draws its nodes and artifacts after loading
    _screenshot(page, "first-run-graph")
    _check_task_list(page, runs, runs.first, "Completed")
    _screenshot(page, "first-run-task-runs")
    _check_artifact_cards(page, runs, runs.first)
    _screenshot(page, "first-run-artifacts")


def test_ui_shows_every_stage_of_the_rerun_as_skipped(runs: Runs, browser: Any) -> None:
    page = browser.new_page()
    _check_task_list(page, runs, runs.second, "Skipped")
    _screenshot(page, "rerun-task-runs-skipped")
    _check_artifact_cards(page, runs, runs.second)


def test_artifact_pages_render_the_metrics_table_and_report(runs: Runs, browser: Any) -> None:
    from playwright.sync_api import expect

    by_key = {a["key"]: a["id"] for a in _artifacts(runs, runs.first)}
    page = browser.new_page()
    page.goto(f"{runs.ui_url}/artifacts/artifact/{by_key[_key(runs, 'sft-metrics')]}")
    for metric, value in (("status", "ran"), ("train_step_compilations", "1")):
        name = page.get_by_text(metric, exact=True)
        row = page.get_by_role("row").filter(has=name)  # table artifacts render cells as text
        expect(row.get_by_role("cell").nth(1)).to_have_text(value, timeout=UI_TIMEOUT_MS)
    _screenshot(page, "sft-metrics-table")
    page.goto(f"{runs.ui_url}/artifacts/artifact/{by_key[_key(runs, 'evaluate-report')]}")
    heading = page.get_by_role("heading", name="Evaluation report")
    expect(heading).to_be_visible(timeout=UI_TIMEOUT_MS)
    for model in ("base", "sft", "grpo"):
        expect(page.get_by_role("cell", name=model, exact=True).first).to_be_visible()
    expect(
        page.get_by_role("columnheader", name="format rate [95% CI]", exact=True).first
    ).to_be_visible()
    _screenshot(page, "evaluate-report")
    page.goto(f"{runs.ui_url}/artifacts/artifact/{by_key[_key(runs, 'sft-checkpoint')]}")
    link = page.get_by_role("link", name=re.compile(r"^sft checkpoint, step 150: "))
    expect(link).to_have_attribute("href", re.compile(r"^file:///.*/smoke/sft-[0-9a-f]{12}/"))


def test_ui_draws_the_dag_recipes_run_graph(
    dag_run: tuple[Any, Any], prefect_api: str, browser: Any
) -> None:
    """The smoke-dag run's page: one task run per node, each waiting on its upstream nodes'
    runs (the edges the graph draws), and the graph itself (screenshot dag-run-graph.png)."""
    from playwright.sync_api import expect

    from pipeline.dag import build_dag
    from schemas.record import StageRecord
    from stages.core import storage

    recipe, summary = dag_run
    dag = build_dag(recipe)
    first = StageRecord.model_validate(storage.read_json(summary.stages[0].record_uri))
    runs = Runs(prefect_api, str(first.flow_run_id), "", run_label(recipe.name, summary.run_uri))
    tasks = _task_runs(runs, runs.first)
    assert sorted(tasks) == sorted(dag.ids)
    names = {t["id"]: name for name, t in tasks.items()}
    drawn = {
        (names[parent["id"]], name)
        for name, task in tasks.items()
        for parent in task["task_inputs"].get("wait_for", [])
    }
    assert drawn == {(source, target) for source, target, _ in dag.edges()}
    page = browser.new_page()
    page.goto(f"{runs.ui_url}/runs/flow-run/{runs.first}")
    expect(page.get_by_text(f"{len(dag.ids)} Task runs").first).to_be_visible(timeout=UI_TIMEOUT_MS)
    page.locator("canvas").first.wait_for(timeout=UI_TIMEOUT_MS)  # the run graph
    page.wait_for_timeout(3000)  # the graph draws its nodes and edges after loading
    assert _screenshot(page, "dag-run-graph").stat().st_size > 0
