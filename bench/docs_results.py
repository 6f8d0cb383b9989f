"""The smoke run docs/getting-started.md quotes, written to docs/results/smoke.json.

Runs `far run recipes/smoke.yaml --root ROOT` as a child process (a fresh run: ROOT/smoke must
not exist yet, so every stage runs), keeps its summary as printed (the tables left out) and
reads from the run's records each stage's seconds, the evaluation's format rate and accuracy
per model and GRPO's reward per step. tests/unit/test_docs_results.py fails when
docs/getting-started.md quotes a smoke number that disagrees with the file, so a doc is
changed by running this, never by hand:

    rm -rf /tmp/far-docs-runs/smoke
    JAX_PLATFORMS=cpu .venv/bin/python -m bench.docs_results   # then paste `excerpt`

The demo's numbers (docs/results/demo.json) come from a fresh-clone measurement;
that file says so, and the same test holds docs/results.md and docs/getting-started.md to it
(tests/unit/test_readme.py the README's table).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "results" / "smoke.json"
STAGE_LINE = re.compile(r"^  (\w+)\s+ran in ([\d.]+) s\s")
FLOW_LINE = re.compile(
    r"^  flow ([\d.]+) s = stages ([\d.]+) s \+ orchestration ([\d.]+) s \(([\d.]+)%\)$"
)


def run_smoke(root: str) -> tuple[list[str], float]:
    """`far run recipes/smoke.yaml --root ROOT`: its stdout lines and the command's seconds."""
    if Path(root, "smoke").exists():
        sys.exit(f"{root}/smoke exists: remove it, so that every stage runs and is timed")
    far = Path(sys.executable).parent / "far"
    start = time.monotonic()
    done = subprocess.run(
        [str(far), "run", "recipes/smoke.yaml", "--root", root],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"far run exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout.splitlines(), seconds


def summary(lines: list[str]) -> dict[str, Any]:
    """The printed summary: the header, each stage's line, the flow line (tables left out)."""
    header = next(i for i, line in enumerate(lines) if line.startswith("FAR run 'smoke'"))
    stages = [line for line in lines[header:] if STAGE_LINE.match(line)]
    flows = [m for m in map(FLOW_LINE.match, lines[header:]) if m]
    if len(stages) != 4 or len(flows) != 1:
        sys.exit("far run's summary changed: update STAGE_LINE / FLOW_LINE\n" + "\n".join(lines))
    flow, total, orchestration, share = (float(x) for x in flows[0].groups())
    return {
        "excerpt": "\n".join([lines[header], *stages, "  ...", flows[0].group(0)]),
        "stage_seconds": {
            m.group(1): float(m.group(2)) for m in map(STAGE_LINE.match, stages) if m
        },
        "flow_seconds": flow,
        "stages_seconds": total,
        "orchestration_seconds": orchestration,
        "orchestration_percent": share,
    }


def record(run: Path, stage: str) -> dict[str, Any]:
    (path,) = run.glob(f"{stage}-*/stage.json")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def measured(run: Path) -> dict[str, Any]:
    """From the records: evaluation scores per model, GRPO's reward and spread per step."""
    scores = record(run, "evaluate")["output"]["scores"]
    history = record(run, "grpo")["history"]
    return {
        "scores": {
            s["name"]: {"format_rate": s["format_rate"], "accuracy": s["accuracy"]} for s in scores
        },
        "grpo_reward_mean": history["rewards/score/mean"],
        "grpo_informative_groups": history["far/informative_groups"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/far-docs-runs")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    lines, seconds = run_smoke(args.root)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    results = {
        "command": f"far run recipes/smoke.yaml --root {args.root}",
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "cpus": os.cpu_count(),
        "load_average_before": round(load, 2),
        "command_seconds": round(seconds, 1),
        **summary(lines),
        **measured(Path(args.root, "smoke")),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {OUT}:\n{results['excerpt']}")


if __name__ == "__main__":
    main()
