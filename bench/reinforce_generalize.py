"""The reinforce-generalize results file (docs/results/reinforce-generalize.json) from its runs'
records.

Each run is `far run recipes/reinforce-generalize.yaml` with one data seed. Its held-out nodes
score every arm greedily at one level each (k2: level k+2, never trained on, the primary
endpoint; k1: the pool's level; le_k: retention on the SFT levels); this writes, per run,
level and arm, the per-prompt outcomes, the greedy accuracy with its Wilson 95% interval and
the exact McNemar comparison with the control (continued SFT on the pool prompts' gold
chains) and with the starting SFT policy. The `k2_sampled` node (8 samples at T 1.0 on the
first k2 prompts) adds each arm's sampled pass@1 (paired sign-flip test) and pass@8 (a prompt
solved by any of its 8 samples; exact McNemar). The pick's choice on k+1 validation, the
pool's size, each node's seconds (over the sessions of its directory) and each GRPO arm's
completions per second (its steps after the first, which compiles; bench/grpo_phases.py)
come with them:

    python -m bench.reinforce_generalize --runs RUN_DIR [RUN_DIR ...] \
        --out docs/results/reinforce-generalize.json

A committed results file never changes: a later seed goes into a new file, which takes the
earlier file's runs unchanged (`--earlier FILE`, recorded in the new file) ahead of its own,
so a run directory that is gone need not be read again:

    python -m bench.reinforce_generalize --runs RUN_DIR --earlier docs/results/A.json \
        --out docs/results/B.json
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Any

from bench import grpo_phases, reinforce_mode
from schemas.recipe.grpo import GRPOConfig
from stages.core import stats

LEVEL_TITLES = {
    "k2": "k+2, never trained on (the primary endpoint): greedy, exact McNemar",
    "k1": "k+1, the pool's level: greedy, exact McNemar",
    "le_k": "levels <= k, SFT's own (retention): greedy, exact McNemar",
}
LEVELS = tuple(LEVEL_TITLES)
SAMPLED = "k2_sampled"
CONTROL, START = reinforce_mode.CONTROL, reinforce_mode.START


def outcomes(node_dir: str) -> dict[str, dict[str, bool]]:
    """model -> prompt id -> whether any of its samples there is correct (pass@n)."""
    lines = Path(node_dir, "samples.jsonl").read_text().splitlines()
    out: dict[str, dict[str, bool]] = {}
    for r in (json.loads(line) for line in lines if line):
        by_id = out.setdefault(r["model"], {})
        by_id[str(r["id"])] = by_id.get(str(r["id"]), False) or float(r["correct"]) == 1.0
    return out


def pass_at_n(node_dir: str) -> list[dict[str, Any]]:
    """Every sampled model's pass@n with its interval, against the control and the SFT."""
    solved = {m: {i: float(v) for i, v in by_id.items()} for m, by_id in outcomes(node_dir).items()}
    rows = []
    for name, by_id in solved.items():
        values = list(by_id.values())
        low, high = stats.rate_interval(values)
        rows.append(
            {
                "model": name,
                "prompts": len(values),
                "pass_at_n": round(sum(values) / len(values), 4),
                "ci95": [round(low, 4), round(high, 4)],
                "vs_control": reinforce_mode.compare(solved[CONTROL], by_id, (CONTROL, name)),
                "vs_sft": reinforce_mode.compare(solved[START], by_id, (START, name)),
            }
        )
    return rows


def per_prompt(node_dir: str) -> dict[str, Any]:
    """The greedy outcomes a reviewer can re-test: the prompt ids once (`ids`), and each
    model's correctness (`correct`: 1 or 0) in that order."""
    outcomes = reinforce_mode.greedy_outcomes(node_dir, "correct")
    ids = list(next(iter(outcomes.values())))
    correct = {model: [round(by_id[i]) for i in ids] for model, by_id in outcomes.items()}
    return {"ids": ids, "correct": correct}


def outcomes_by_id(level: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A results file's per-prompt level as model -> prompt id -> correctness."""
    ids = level["ids"]
    return {
        model: dict(zip(ids, map(float, values), strict=True))
        for model, values in level["correct"].items()
    }


def grpo_throughput(record: dict[str, Any]) -> dict[str, Any]:
    """A GRPO arm's seconds a step and completions per second, from its record's phase timing."""
    config = GRPOConfig.model_validate(record["config"]["grpo"])  # with the defaults it omits
    arm = grpo_phases.arm_summary(record["history"], config, config.skip_flat_groups)
    keys = ("step_seconds", "completions_per_s", "trained_completions_per_s", "median_step_seconds")
    return {key: round(arm[key], 3) for key in keys}


def node_seconds(record: dict[str, Any]) -> float:
    """A node's seconds over every session its directory saw (a stopped session's too)."""
    sessions = record.get("sessions") or [record]
    return round(sum(session["seconds"] for session in sessions), 1)


def summary(run: Path) -> dict[str, Any] | None:
    """One run's results, or None when its primary node (k2) has not committed yet."""
    nodes = reinforce_mode.records(run)
    if "k2" not in nodes:
        return None
    recipe = json.loads((run / "run.json").read_text())["recipe"]
    choice = json.loads(Path(nodes["pick"]["_dir"], "choice.json").read_text())
    sampled = nodes.get(SAMPLED)
    return {
        "run": run.name,
        "data_seed": recipe["data"]["seed"],
        "git_commit": nodes["k2"]["code"]["git_commit"],
        "pool": nodes["pool"]["metrics"],
        "pick": {
            "chosen": choice["chosen"],
            "validation": {c["name"]: round(c["accuracy"], 4) for c in choice["candidates"]},
        },
        "seconds": {node: node_seconds(r) for node, r in sorted(nodes.items())},
        "grpo_throughput": {
            node: grpo_throughput(r) for node, r in sorted(nodes.items()) if r["stage"] == "grpo"
        },
        "levels": {
            level: reinforce_mode.arms(nodes[level]["_dir"]) for level in LEVELS if level in nodes
        },
        "per_prompt": {
            level: per_prompt(nodes[level]["_dir"]) for level in LEVELS if level in nodes
        },
        **(
            {
                "sampled_pass_at_1": reinforce_mode.sampled_arms(sampled["_dir"]),
                "sampled_pass_at_n": pass_at_n(sampled["_dir"]),
            }
            if sampled
            else {}
        ),
    }


GREEDY_HEAD = ["greedy [95% CI]", "vs control (won/lost, p)", "vs sft (won/lost, p)"]


def page(results: list[dict[str, Any]]) -> str:
    """Every run's tables side by side, one seed's columns after another's: greedy at each
    level, then sampled pass@1 and pass@n at k+2 (the results page shows exactly these)."""
    parts = []
    for level, title in LEVEL_TITLES.items():
        missing = [r["run"] for r in results if level not in r["levels"]]
        if missing:  # an interim run: its node has not committed yet
            parts.append(f"**{title}**\n\nnot measured yet in {', '.join(missing)}")
            continue
        rows = [{**r, level: r["levels"][level]} for r in results]
        table = reinforce_mode.side_by_side(rows, level, GREEDY_HEAD, reinforce_mode.cells)
        parts.append(f"**{title}**\n\n{table}")
    if all("sampled_pass_at_1" in r for r in results):
        head = ["pass@1 [95% CI]", "vs control [95% CI] (p)", "vs sft"]
        table = reinforce_mode.side_by_side(
            results, "sampled_pass_at_1", head, reinforce_mode.sampled_cells
        )
        parts.append(f"**k+2, sampled at T 1.0: pass@1, paired sign-flip test**\n\n{table}")
        head = ["pass@n [95% CI]", "vs control (won/lost, p)", "vs sft (won/lost, p)"]
        pass_cells = functools.partial(reinforce_mode.cells, value="pass_at_n")
        table = reinforce_mode.side_by_side(results, "sampled_pass_at_n", head, pass_cells)
        parts.append(f"**k+2, sampled at T 1.0: pass@n, exact McNemar**\n\n{table}")
    return "\n\n".join(parts)


def combine(earlier: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An earlier file's runs, unchanged, then the new ones; a data seed in both is refused
    (one seed counted twice would pass for two)."""
    seen = {r["data_seed"]: r["run"] for r in earlier}
    for run in new:
        if run["data_seed"] in seen:
            raise SystemExit(
                f"data seed {run['data_seed']} is in the earlier file already (run "
                f"{seen[run['data_seed']]!r}); got it again from {run['run']!r}"
            )
        seen[run["data_seed"]] = run["run"]
    return [*earlier, *new]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--earlier", type=Path, help="a committed results file whose runs come first, unchanged"
    )
    args = parser.parse_args()
    results = [r for r in (summary(run) for run in args.runs) if r is not None]
    document: dict[str, Any] = {"runs": results}
    if args.earlier:
        earlier = json.loads(args.earlier.read_text())["runs"]
        document = {"earlier": args.earlier.name, "runs": combine(earlier, results)}
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    if document["runs"]:
        print(page(document["runs"]))


if __name__ == "__main__":
    main()
