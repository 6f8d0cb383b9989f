"""`far run` with malformed data sources: exit 2, one line naming the file (and row) and what
was expected, no traceback; with -v the traceback too.

The table runs `flows.cli.main` for every case in one child process (one temporary Prefect
server; each case a real flow run whose data_prep fails, its stderr taken at the descriptor
level); one case runs the installed `far` executable on its own, as a user would.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows import cli
from flows.commands import console
from tests.conftest import BIN, REPO, smoke_data

pytestmark = pytest.mark.slow
ROW = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}
LONG = {**ROW, "question": "Long? " + "x" * 400}
PARQUET_MAGIC = b"PAR1"
CHILD = Path(__file__).parent / "_cli_cases_child.py"

# (file name, content, what the one line must say)
CASES: list[tuple[str, bytes | None, str]] = [
    ("missing.jsonl", None, r"data\.eval\.sources\[0\]\.name: data source file not found"),
    ("empty.jsonl", b"", r"empty\.jsonl is empty; expected rows of JSON lines"),
    ("blank.json", b"\n\n", r"blank\.json is empty; expected rows of a JSON list"),
    ("not-json.json", b"question: 1\n", r"not-json\.json is not valid JSON at line 1"),
    ("object.json", json.dumps(ROW).encode(), r"object\.json holds a JSON dict; expected a list"),
    ("latin1.json", b'[{"question": "caf\xe9"}]', r"latin1\.json is not valid UTF-8"),
    ("plain.jsonl.gz", json.dumps(ROW).encode(), r"plain\.jsonl\.gz is not a complete gzip"),
    ("cut.jsonl.gz", gzip.compress(json.dumps(ROW).encode() * 40)[:-10], r"cut\.jsonl\.gz is"),
    ("bad.parquet", PARQUET_MAGIC + b"junk" + PARQUET_MAGIC, r"bad\.parquet is not a readable"),
    ("rows.tsv", b"question\tanswer\n", r"rows\.tsv: unknown file type"),
    ("header.csv", b"question,answer\n", r"header\.csv has a header and no rows"),
    ("no-answer.jsonl", b'{"question": "x"}\n', r"no column 'answer'.*columns \['question'\]"),
    ("int.jsonl", b'{"question": 5, "answer": "#### 5"}\n', r"row 0: field 'question' is int"),
    ("lines.jsonl", b"nope\n", r"row 0: line 1 is not valid JSON"),
    ("scalars.json", b"[1, 2]", r"row 0: row 0 is not a JSON object.*\(and 1 more\)"),
    ("words.jsonl", b'{"question": "q?", "answer": "#### four"}\n', r"'four' is not a number"),
    ("long.jsonl", json.dumps(LONG).encode(), r"split 'eval' is empty.*quarantine\.jsonl"),
]


def _recipe(tmp_path: Path, name: str, content: bytes | None) -> Path:
    data = smoke_data()
    source = tmp_path / name
    if content is not None:
        source.write_bytes(content)
    data["data"]["eval"] = {
        "size": 2,
        "sources": [{"kind": "file", "name": str(source), "adapter": "gsm8k"}],
    }
    data["storage_root"] = str(tmp_path / "runs")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case through `far run` in one child process (one temporary Prefect server)."""
    home = tmp_path_factory.mktemp("cli-cases")
    cases: dict[str, tuple[str, list[str]]] = {}
    for name, content, _ in CASES:
        folder = home / name
        folder.mkdir()
        cases[name] = (str(_recipe(folder, name, content)), [])
    verbose = home / "verbose"
    verbose.mkdir()
    cases["verbose"] = (str(_recipe(verbose, "empty.jsonl", b"")), ["-v"])
    (home / "cases.json").write_text(json.dumps(cases))
    env = dict(os.environ, PREFECT_HOME=str(home / "prefect"), JAX_PLATFORMS="cpu")
    env.pop("PREFECT_API_URL", None)
    subprocess.run(
        [sys.executable, str(CHILD), str(home / "cases.json"), str(home / "results.json")],
        env=env,
        cwd=REPO,
        check=True,
        timeout=900,
    )
    return dict(json.loads((home / "results.json").read_text()))


@pytest.mark.parametrize(("name", "content", "message"), CASES, ids=[c[0] for c in CASES])
def test_malformed_source_is_one_line_and_exit_2(
    outcomes: dict[str, dict[str, Any]], name: str, content: bytes | None, message: str
) -> None:
    code, err = outcomes[name]["code"], outcomes[name]["stderr"]
    assert code == cli.EXIT_INVALID, err
    lines = [line for line in err.splitlines() if line.startswith("far: ")]
    assert len(lines) == 1, err
    assert name in lines[0] and re.search(message, lines[0]), lines[0]
    for unwanted in ("Traceback", "Failed(", "ERROR"):
        assert unwanted not in err, err
    if "quarantine.jsonl" in lines[0]:  # every reason the line points to exists
        uri = lines[0].rsplit(": ", 1)[1]
        rows = [json.loads(row) for row in Path(uri).read_text().splitlines()]
        assert any(r["source"] == f"file/{name}" for r in rows)


def test_verbose_adds_the_traceback(outcomes: dict[str, dict[str, Any]]) -> None:
    code, err = outcomes["verbose"]["code"], outcomes["verbose"]["stderr"]
    assert code == cli.EXIT_INVALID
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("far: ")


def test_the_far_executable_with_its_temporary_server(tmp_path: Path) -> None:
    """A user's first run: a new temporary Prefect server, a bad file; exit 2, one line, and
    no ERROR or traceback from the server either (its telemetry heartbeat is off)."""
    recipe = _recipe(tmp_path, "not-json.json", b"question: 1\n")
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "JAX_PLATFORMS": "cpu",
    }
    done = subprocess.run(
        [str(BIN / "far"), "run", str(recipe)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("far: ")] == [
        f"far: data.eval.sources[0]: data source {tmp_path / 'not-json.json'} is not valid JSON "
        "at line 1 column 1: "
        "Expecting value; expected a JSON list of objects (use .jsonl for one object per line)"
    ]
    for unwanted in ("Traceback", "ERROR", "database is locked", "Failed"):
        assert unwanted not in done.stderr + done.stdout, done.stderr


def _far_run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "JAX_PLATFORMS": "cpu",
    }
    return subprocess.run(
        [str(BIN / "far"), *argv], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_directory_where_a_file_belongs_is_refused_before_start_up(
    tmp_path: Path, command: str
) -> None:
    """A data source and a recipe that are directories: one line and exit 2 before the flow
    (and its Prefect server) starts, never a traceback after data-prep's start-up."""
    folder = tmp_path / "rows.jsonl"
    folder.mkdir()
    recipe = _recipe(tmp_path, "rows.jsonl", None)
    done = _far_run(tmp_path, command, str(recipe))
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"far: data.eval.sources[0].name: {folder} is a directory; expected a data source file"
    ]
    assert "Starting temporary server" not in done.stdout + done.stderr  # no flow started
    done = _far_run(tmp_path, command, str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"far: recipe {tmp_path} is a directory; expected a recipe YAML file"
    ]


def test_duplicate_keys_in_a_recipe_are_refused(tmp_path: Path) -> None:
    recipe = tmp_path / "twice.yaml"
    text = yaml.safe_dump({**smoke_data(), "storage_root": str(tmp_path / "runs")}, sort_keys=False)
    recipe.write_text(text.replace("\nsft:\n", "\nsft:\n  max_steps: 3\n", 1))
    done = _far_run(tmp_path, "run", str(recipe))
    assert done.returncode == 2, done.stderr
    assert "duplicate key 'max_steps' at line" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_a_temporary_server_that_does_not_start_in_time_is_explained(tmp_path: Path) -> None:
    """The startup timeout is sized for slow machines (300 s); when even that is not enough
    (here: 1 s), `far` says what happened and what to do instead of a Prefect traceback."""
    env = dict(
        os.environ,
        PREFECT_HOME=str(tmp_path / "prefect"),
        JAX_PLATFORMS="cpu",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1",
    )
    env.pop("PREFECT_API_URL", None)
    root = tmp_path / "runs"
    done = subprocess.run(
        [str(BIN / "far"), "run", str(REPO / "recipes" / "smoke.yaml"), "--root", str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == console.EXIT_PREFECT, done.stderr
    assert "Traceback" not in done.stderr
    assert "temporary local server did not start within 1 s" in done.stderr
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in done.stderr
    assert console.PREFECT_DEFAULTS["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "300"
