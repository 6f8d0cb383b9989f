"""The SFT plateau sweep's results file (docs/results/sft-sweep.json) from its run directories.

Each run under --runs is one sweep point (`far run SWEEP.yaml --name sweep-d1-lr3.0e-4-n320
sft.learning_rate=3.0e-4 sft.max_steps=320`, see docs/log.md): its sft stage and a greedy
evaluate node of the prompts SFT never trains on. This reads every such run and writes, per
point, the learning rate, the steps and the greedy accuracy with its prompt count, so the
numbers the README and the log quote come from one file a command regenerates.

    python -m bench.sft_sweep --runs /work/exp/s12/sweep/runs --out docs/results/sft-sweep.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def point(run: Path) -> dict[str, Any] | None:
    """One sweep point from a run directory, or None when it has no committed evaluation."""
    records = {p.parent.name.split("-")[0]: p for p in run.glob("*/stage.json")}
    if "sft" not in records or "validation" not in records:
        return None
    sft = json.loads(records["sft"].read_text())
    samples = records["validation"].parent / "samples.jsonl"
    correct = [json.loads(line)["correct"] for line in samples.read_text().splitlines() if line]
    return {
        "run": run.name,
        "learning_rate": sft["config"]["sft"]["learning_rate"],
        "steps": sft["config"]["sft"]["max_steps"],
        "prompts": len(correct),
        "greedy_accuracy": round(sum(correct) / len(correct), 3),
        "split": "grpo_train (never trained on by SFT)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="the sweep's storage root")
    parser.add_argument("--out", default="docs/results/sft-sweep.json")
    args = parser.parse_args()
    points = [p for run in sorted(Path(args.runs).iterdir()) if (p := point(run))]
    Path(args.out).write_text(json.dumps({"points": points}, indent=2) + "\n")
    print(f"{len(points)} points -> {args.out}")


if __name__ == "__main__":
    main()
