"""`make test`'s xdist groups hold: each test file runs on one worker (its module fixtures are
built once) and the files sharing the session's flow runs run on one worker together (each run
is built once). A real two-worker pytest session on a small tree laid out like tests/, with
tests/conftest.py's own scheduling hooks; the fixtures log which worker built them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO, SHARED_RUN_FILES, xdist_group

CONFTEST = """
import os
import pytest
from tests.conftest import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401

def built(name):
    with open(os.environ["BUILT_LOG"], "a") as log:
        log.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.fixture(scope="session")
def dag_run():
    built("dag_run")

@pytest.fixture(scope="session")
def smoke_twice():
    built("smoke_twice")

@pytest.fixture(scope="module")
def module_fixture(request):
    built(request.module.__name__)
"""

TEST_FILE = """
import pytest

@pytest.mark.parametrize("n", range(4))
def test_it(module_fixture, {fixtures}n):
    pass
"""


def _tree(root: Path) -> list[str]:
    """Four files sharing the runs and five files of their own, named like tests/'s."""
    (root / "conftest.py").write_text(CONFTEST)
    (root / "pytest.ini").write_text("[pytest]\n")
    files = sorted(SHARED_RUN_FILES) + [f"tests/unit/test_own_{i}.py" for i in range(5)]
    for i, name in enumerate(files):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        shared = ("dag_run, ", "smoke_twice, ")[i % 2] if name in SHARED_RUN_FILES else ""
        path.write_text(TEST_FILE.format(fixtures=shared))
    return files


def test_groups_are_files_and_the_shared_run_files_together() -> None:
    assert xdist_group("tests/unit/test_a.py::test_b[x::y]") == "tests/unit/test_a.py"
    groups = {xdist_group(f"{path}::test") for path in SHARED_RUN_FILES}
    assert groups == {"shared-runs"}


def test_a_file_using_a_shared_run_outside_the_list_is_refused(tmp_path: Path) -> None:
    _tree(tmp_path)
    stray = tmp_path / "tests" / "integration" / "test_new_use_of_dag_run.py"
    stray.write_text(TEST_FILE.format(fixtures="dag_run, "))
    done = _pytest(tmp_path, [str(stray.relative_to(tmp_path))])
    assert done.returncode == 4, done.stdout + done.stderr  # a usage error, before any test
    assert "tests/integration/test_new_use_of_dag_run.py use(s)" in done.stderr
    assert "add the file to SHARED_RUN_FILES in tests/conftest.py" in done.stderr
    assert not (tmp_path / "built.log").exists()


def _pytest(root: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, BUILT_LOG=str(root / "built.log"), PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_two_workers_keep_each_group_on_one_worker(tmp_path: Path) -> None:
    files = _tree(tmp_path)
    done = _pytest(tmp_path, ["-v", "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder"])
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+?)::", done.stdout)
    assert len(ran) == 4 * len(files), done.stdout
    workers = defaultdict(set)
    for worker, path in ran:
        workers[xdist_group(path)].add(worker)
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
    assert len(set().union(*workers.values())) == 2, dict(workers)  # both workers got work
    builds = (tmp_path / "built.log").read_text().splitlines()
    names = [line.split()[0] for line in builds]
    assert sorted(names) == sorted(set(names)), builds  # each fixture built once
    assert {"dag_run", "smoke_twice"} <= set(names), builds
