"""README.md is a product page, not a lab notebook: a newcomer reads what FAR is and the two
commands on the first screen, a short comparison whose rows each link the page that shows
them, and one small results table whose every number is computed here from the results file
(docs/results/demo.json). No commit hashes, no session or issue numbers, no line too wide to
read outside a code block; the long tables live on docs/results.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stages.core.stats import wilson_interval
from tests.conftest import REPO

README = REPO / "README.md"
MAX_LINES = 120
FIRST_SCREEN = 30
MAX_WIDTH = 120
# a commit hash: 7 to 40 hex digits, at least one of them a digit (so no English word matches)
HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
SESSION_OR_ISSUE = re.compile(r"\b(session|issue)s?\s+#?\d+", re.IGNORECASE)
# the comparison's rows: capability -> a test file that holds FAR to it
BACKED_BY = {
    "Resume across time-limited sessions": "tests/unit/test_session_stops.py",
    "Sealed records, published ledger root": "tests/unit/test_audit_forgeries.py",
    "Lineage to the data, and an audit": "tests/unit/test_records.py",
    "Paired tests vs a same-compute control": "tests/unit/test_eval_stats.py",
    "Validation pick, never a regression": "tests/unit/test_mode_selection.py",
    "An OS-isolated reward sandbox": "tests/unit/test_redteam.py",
}
TOOLS = ["TRL", "verl", "MaxText", "Tunix CLI"]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside ``` code blocks."""
    lines, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        if not inside:
            lines.append((number, line))
    return lines


def readme_problems(text: str) -> list[str]:
    """What keeps `text` from being the front page: length, the first screen, hashes,
    session or issue numbers, wide lines."""
    problems = []
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        problems.append(f"{len(lines)} lines, at most {MAX_LINES}: move detail into docs/")
    screen = [line.strip() for line in lines[:FIRST_SCREEN]]
    for command in ("make run", "make test"):
        if not any(line.startswith(command + " ") or line == command for line in screen):
            problems.append(f"`{command}` is not a command in the first {FIRST_SCREEN} lines")
    for number, line in enumerate(lines, 1):
        problems += [f"line {number}: a commit hash {m}" for m in HASH.findall(line)]
        for match in SESSION_OR_ISSUE.finditer(line):
            problems.append(f"line {number}: {match.group(0)!r} (say what, not when)")
    for number, line in prose_lines(text):
        if len(line) > MAX_WIDTH:
            problems.append(f"line {number}: {len(line)} characters, at most {MAX_WIDTH}")
    return problems


def test_the_readme_is_a_product_page() -> None:
    problems = readme_problems(README.read_text())
    assert not problems, "README.md:\n" + "\n".join(problems)


def test_the_page_check_finds_each_problem() -> None:
    """The check itself: each rule catches a page that breaks it, and passes one that does not."""
    good = "# FAR\n\n```\nmake run     # the demo\nmake test\n```\n"
    assert readme_problems(good) == []
    wide_code = good.replace("# the demo", "# " + "x" * 200)
    assert readme_problems(wide_code) == []  # code blocks may be wide
    bad = {
        "lines": good + "text\n" * MAX_LINES,
        "first screen": "# FAR\n" + "\n" * FIRST_SCREEN + "make run\nmake test\n",
        "hash": good + "measured at 930e0d0\n",
        "session": good + "as session " + "24 found\n",  # split: no citation in the source
        "issue": good + "see Issue 35\n",
        "width": good + "y" * (MAX_WIDTH + 1) + "\n",
    }
    for rule, text in bad.items():
        assert readme_problems(text), f"the {rule} rule let a bad page through"
    assert not HASH.findall("a decade of facades, 2026-11-26, 285 s")


def table_after(text: str, heading: str) -> list[list[str]]:
    """The cells of the first Markdown table after `heading`, header and rule left out."""
    section = text.split(heading, 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    first = section.splitlines().index(rows[0])
    table = []
    for line in section.splitlines()[first:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip("|").split("|")])
    return table[2:]


def demo() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPO / "docs" / "results" / "demo.json").read_text())
    return data


def scored(correct: int, prompts: int) -> str:
    low, high = wilson_interval(correct, prompts)
    return f"{correct / prompts:.2f} [{low:.2f}, {high:.2f}]"


def expected_results_rows() -> list[list[str]]:
    results = demo()
    held_out, shot = results["held_out"], results["base_3shot"]
    n = held_out["prompts"]
    # the counts are the ones behind the file's own accuracies
    for model in ("sft", "grpo"):
        assert round(held_out["correct"][model] / n, 3) == results["accuracy"][model]
    assert round(shot["correct"] / shot["prompts"], 3) == shot["accuracy"]

    def row(label: str, model: str) -> list[str]:
        rate, correct = held_out["format_rate"][model], held_out["correct"][model]
        return [label, f"{rate:.2f}", scored(correct, n)]

    three_shot = [
        "base, 3 worked examples before each prompt",
        f"{shot['format_rate']:.2f}",
        scored(shot["correct"], shot["prompts"]),
    ]
    return [
        row("base", "base"),
        three_shot,
        row("SFT, 40 LoRA steps", "sft"),
        row("GRPO, 6 steps after SFT", "grpo"),
    ]


def test_the_results_table_is_computed_from_the_results_file() -> None:
    """Every number in the README's results table: format rate, accuracy and its Wilson
    interval, from docs/results/demo.json's counts."""
    shown = table_after(README.read_text(), "## Results")
    assert shown == expected_results_rows()


def test_the_control_headline_is_the_results_files() -> None:
    """The one sentence about the control experiments: the seeds, the arms and the pick's
    output are those of docs/results/reinforce-mode-three-seeds.json."""
    three_seeds = REPO / "docs" / "results" / "reinforce-mode-three-seeds.json"
    runs = json.loads(three_seeds.read_text())["runs"]
    flat = " ".join(README.read_text().split())
    assert f"in {len(runs)} data seeds, no reinforcement arm (GRPO, ORPO, self-teaching)" in flat
    arms = {row["model"] for run in runs for row in run["held_out"]}
    assert arms - {"sft", "control", "chosen"} == {"grpo", "orpo", "self"}
    for run in runs:  # no arm beat the control, greedy or sampled, at p < 0.05
        for key in ("held_out", "sampled"):
            for row in run[key]:
                if row["model"] in ("grpo", "orpo", "self"):
                    gain = row["vs_control"]
                    assert gain["difference"] <= 0 or gain["p_value"] >= 0.05, (run, row)
    assert {run["pick"]["chosen"] for run in runs} == {"sft"}
    assert "the validation pick shipped SFT every time" in flat
    assert "[the results](docs/results.md)" in flat


def test_the_generalize_headline_is_the_results_files() -> None:
    """The one sentence about Reinforce on harder problems: the k+2 prompts, GRPO's and the
    control's greedy accuracy and McNemar p, the random-reward arm's and SFT's, as
    docs/results/reinforce-generalize.json has them (seed 1), and the reviewer's command."""
    path = REPO / "docs" / "results" / "reinforce-generalize.json"
    runs = json.loads(path.read_text())["runs"]
    seed1 = next(run for run in runs if run["data_seed"] == 1)
    rows = {row["model"]: row for row in seed1["levels"]["k2"]}
    grpo, control = rows["grpo"], rows["control"]
    flat = " ".join(README.read_text().split())
    assert f"{grpo['prompts']:,} held-out prompts, greedy" in flat
    quoted = (
        f"({grpo['greedy_accuracy']:.3f} against {control['greedy_accuracy']:.3f}, McNemar p "
        f"{grpo['vs_control']['p_value']:.2f})"
    )
    assert quoted in flat, quoted
    assert grpo["greedy_accuracy"] <= control["greedy_accuracy"]  # "did not beat"
    random, sft = rows["random"]["greedy_accuracy"], rows["sft"]["greedy_accuracy"]
    assert f"({random:.3f} against {sft:.3f})" in flat
    assert rows["random"]["vs_sft"]["p_value"] > 0.05  # "scored as SFT"
    assert "--name reinforce-generalize-d7 data.seed=7" in flat


def test_each_comparison_row_links_its_page_and_has_a_test() -> None:
    text = README.read_text()
    table = table_after(text, "## Why FAR")
    header = text.split("## Why FAR", 1)[1].split("\n| ", 1)[1].split("\n", 1)[0]
    assert [cell.strip() for cell in header.strip(" |").split("|")][1:] == TOOLS
    capabilities = {}
    for cells in table:
        link = re.fullmatch(r"\[(.+)\]\[(\w+)\]", cells[0])
        assert link, f"the row {cells[0]!r} does not link the page that shows it"
        capabilities[link.group(1)] = link.group(2)
        assert len(cells) == 1 + len(TOOLS), cells
    assert set(capabilities) == set(BACKED_BY)
    for capability, label in capabilities.items():
        target = re.search(rf"^\[{label}\]: (\S+)$", text, re.MULTILINE)
        assert target, f"no link target for [{label}]"
        assert (REPO / target.group(1).split("#")[0]).is_file()
        assert (REPO / BACKED_BY[capability]).is_file()


def test_the_readme_says_how_far_gets_on_path() -> None:
    assert "source .venv/bin/activate" in README.read_text()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_env_ends_with_the_activate_line(tmp_path: Path) -> None:
    """`make env` (the set-up `make run` and `make test` start with) ends by saying how to get
    `far` on PATH. Real make on the real Makefile; the venv is a stand-in already installed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("Makefile", "requirements.lock", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    (venv / "bin" / ".installed").touch()  # newer than the lock: no install
    made = subprocess.run(
        ["make", "--no-print-directory", "env", "VENV=venv", "BUILD_INFO=build-info.json"],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    last = made.stdout.strip().splitlines()[-1]
    assert "source venv/bin/activate" in last and "far " in last, made.stdout
