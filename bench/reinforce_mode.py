"""The reinforce-mode results file (docs/results/reinforce-mode.json) from its runs' records.

Each run is `far run recipes/reinforce-mode.yaml` with one data seed (see docs/log.md). Its
`evaluate` node scores every arm greedily on the held-out prompts; this reads that node's
samples and writes, per run and arm, the greedy accuracy with its Wilson 95% interval, the
strict format rate, and the exact McNemar comparison with the control (continued SFT, the same
optimizer steps) and with the starting SFT policy. It adds what the pick node chose on the
validation split (and what it chooses from the same rows with the McNemar rule, max_p, alone
and Holm-adjusted over the run's choices, with each choice's adjusted p-value), how
many prompts the mode selection kept, and each node's seconds, so the README's table and the
log's come from one file a command regenerates. A run whose recipe has the `sampled` node
(2 samples at T 1.0 on the first 256 held-out prompts) also gets each arm's sampled pass@1
against the control and the starting SFT (paired sign-flip test of per-prompt solve rates):

    python -m bench.reinforce_mode --runs /work/exp/s13/rm/reinforce-mode \
        /work/exp/s14/rm/reinforce-mode-d0 --out docs/results/reinforce-mode.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from stages import pick
from stages.core import stats
from stages.evaluate import reports
from stages.rewards.answers import extract_answer

CONTROL = "control"
START = "sft"
MAX_P = 0.05  # the pick's max_p in recipes/reinforce-mode.yaml (runs before it had none)


def records(run: Path) -> dict[str, dict[str, Any]]:
    """Each committed node's stage.json, by node id (a directory is `<node id>-<hash>`). A run
    continued with `--allow-change` holds a node's earlier directories too: the latest wins."""
    out: dict[str, dict[str, Any]] = {}
    found = [json.loads(p.read_text()) | {"_dir": str(p.parent)} for p in run.glob("*/stage.json")]
    for record in sorted(found, key=lambda r: r.get("finished_at") or ""):
        if record.get("status") == "complete":
            out[Path(record["_dir"]).name.rsplit("-", 1)[0]] = record
    return out


def greedy_outcomes(node_dir: str, key: str) -> dict[str, dict[str, float]]:
    """model -> prompt id -> the `key` outcome (correct or format) of its first sample."""
    lines = Path(node_dir, "samples.jsonl").read_text().splitlines()
    samples = [json.loads(line) for line in lines if line]
    out: dict[str, dict[str, float]] = {}
    for model in dict.fromkeys(r["model"] for r in samples):
        ids = dict.fromkeys(str(r["id"]) for r in samples if r["model"] == model)
        out[model] = dict(zip(ids, reports.per_prompt(samples, model, key), strict=True))
    return out


def compare(base: dict[str, float], other: dict[str, float], names: tuple[str, str]) -> dict:
    ids = sorted(base)
    paired = stats.paired_comparison(
        names[0], [base[i] for i in ids], names[1], [other[i] for i in ids]
    )
    return {
        "difference": round(paired.difference, 4),
        "wins": paired.candidate_only,
        "losses": paired.baseline_only,
        "p_value": paired.p_value,
    }


def arms(evaluate_dir: str) -> list[dict[str, Any]]:
    """Every model the evaluate node scored, against the control and the starting SFT."""
    correct = greedy_outcomes(evaluate_dir, "correct")
    fmt = greedy_outcomes(evaluate_dir, "format")
    rows = []
    for name, outcomes in correct.items():
        values = list(outcomes.values())
        low, high = stats.rate_interval(values)
        rows.append(
            {
                "model": name,
                "prompts": len(values),
                "greedy_accuracy": round(sum(values) / len(values), 4),
                "ci95": [round(low, 4), round(high, 4)],
                "format_rate": round(sum(fmt[name].values()) / len(values), 4),
                "vs_control": compare(correct[CONTROL], outcomes, (CONTROL, name)),
                "vs_sft": compare(correct[START], outcomes, (START, name)),
            }
        )
    return rows


def sampled_arms(node_dir: str) -> list[dict[str, Any]]:
    """Every model the `sampled` node scored (k samples a prompt at a temperature): pass@1,
    the mean of the per-prompt solve rates, with its 95% interval over prompts, and the
    paired sign-flip test of those rates against the control and the starting SFT."""
    lines = Path(node_dir, "samples.jsonl").read_text().splitlines()
    rates: dict[str, dict[str, list[float]]] = {}
    for r in (json.loads(line) for line in lines if line):
        rates.setdefault(r["model"], {}).setdefault(str(r["id"]), []).append(float(r["correct"]))
    ids = sorted(rates[START])
    arrays = {model: np.asarray([by_id[i] for i in ids]) for model, by_id in rates.items()}
    rows = []
    for name, solved in arrays.items():
        low, high = stats.rate_interval(list(solved.mean(axis=1)))
        rows.append(
            {
                "model": name,
                "prompts": int(solved.shape[0]),
                "samples": int(solved.shape[1]),
                "pass_at_1": round(float(solved.mean()), 4),
                "ci95": [round(low, 4), round(high, 4)],
                "vs_control": compare_rates(arrays[CONTROL], solved),
                "vs_sft": compare_rates(arrays[START], solved),
            }
        )
    return rows


def compare_rates(base: np.ndarray, other: np.ndarray) -> dict[str, Any]:
    paired = stats.paired_rates(base, other)
    return {
        "difference": round(paired.difference, 4),
        "ci95": [round(paired.ci_low, 4), round(paired.ci_high, 4)],
        "prompts_up": paired.prompts_up,
        "prompts_down": paired.prompts_down,
        "p_value": paired.p_value,
    }


def chosen_under_max_p(choice: dict[str, Any], max_p: float, correction: str = "none") -> str:
    """What the pick would choose from the same validation rows with `max_p` set and
    `correction` (a run recorded before the rule existed has no p-values in choice.json: they
    come from its wins and losses, as the pick computes them)."""
    return pick.choose(*_accuracy(choice), max_p=max_p, p_values=_p(choice, correction))


def _accuracy(choice: dict[str, Any]) -> tuple[dict[str, float], float]:
    return {c["name"]: c["accuracy"] for c in choice["candidates"]}, choice["min_gain"]


def _p(choice: dict[str, Any], correction: str) -> dict[str, float]:
    """Each choice's p-value as the pick's `max_p` would test it under `correction`."""
    rows = [
        {
            **c,
            "p_vs_incumbent": stats.mcnemar_exact_p(
                c["wins_vs_incumbent"], c["losses_vs_incumbent"]
            ),
        }
        for c in choice["candidates"]  # the incumbent first
    ]
    return pick.tested_p_values(rows, rows[0]["name"], correction)


def holm_p(choice: dict[str, Any]) -> dict[str, float]:
    """Each choice's Holm-adjusted p over all the run's choices, rounded for the file."""
    return {name: round(p, 4) for name, p in _p(choice, "holm").items()}


def negative(answer: str | None) -> bool:
    return answer is not None and answer.strip().startswith("-")


def first_samples(node_dir: str) -> dict[str, dict[str, dict[str, Any]]]:
    """model -> prompt id -> its first sample row."""
    lines = Path(node_dir, "samples.jsonl").read_text().splitlines()
    first: dict[str, dict[str, dict[str, Any]]] = {}
    for r in (json.loads(line) for line in lines if line):
        first.setdefault(r["model"], {}).setdefault(str(r["id"]), r)
    return first


def sign_fixes(pool: list[dict[str, Any]], greedy: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Among the pool's greedy-wrong prompts, those whose greedy answer is the gold answer with
    the other sign, by the sign the gold answer has (what training on them teaches)."""
    fixes = {"to_negative": 0, "to_positive": 0, "greedy_wrong": 0}
    for prompt in pool:
        answer = extract_answer(greedy[str(prompt["id"])]["completion"])
        gold = str(prompt["answer"]).strip()
        if answer is None or answer.strip() == gold:
            continue
        fixes["greedy_wrong"] += 1
        if answer.strip().lstrip("-") == gold.lstrip("-"):
            fixes["to_negative" if negative(gold) else "to_positive"] += 1
    return fixes


def answer_signs(evaluate_dir: str, mode_dir: str, headroom_dir: str) -> dict[str, Any]:
    """The share of negative answers: gold and each model's greedy answer on the held-out
    prompts, and gold on the prompts the mode selection kept for training, with how many of
    the pool's greedy-wrong answers are the gold answer's sign flipped. An arm trained on a
    pool whose fixes mostly flip one way can learn the flip as a prior (docs/log.md, session
    16)."""
    first = first_samples(evaluate_dir)
    gold = list(first[START].values())
    pool_lines = Path(mode_dir, "grpo_prompts.jsonl").read_text().splitlines()
    pool = [json.loads(line) for line in pool_lines if line]
    return {
        "held_out_gold_negative": round(sum(negative(r["answer"]) for r in gold) / len(gold), 4),
        "mode_pool_gold_negative": [sum(negative(r["answer"]) for r in pool), len(pool)],
        "mode_pool_sign_fixes": sign_fixes(pool, first_samples(headroom_dir)[f"{START}@greedy"]),
        "held_out_answers_negative": {
            model: round(
                sum(negative(extract_answer(r["completion"])) for r in rows.values()) / len(rows),
                4,
            )
            for model, rows in first.items()
        },
    }


def summary(run: Path) -> dict[str, Any] | None:
    """One run's results, or None when its evaluate node has not committed yet."""
    nodes = records(run)
    if "evaluate" not in nodes:
        return None
    recipe = json.loads((run / "run.json").read_text())["recipe"]
    choice = json.loads(Path(nodes["pick"]["_dir"], "choice.json").read_text())
    return {
        "run": run.name,
        "data_seed": recipe["data"]["seed"],
        "sft_steps": nodes["sft"]["config"]["sft"]["max_steps"],
        "git_commit": nodes["evaluate"]["code"]["git_commit"],
        "mode_prompts": nodes["mode"]["metrics"],
        "pick": {
            "chosen": choice["chosen"],
            "max_p": choice.get("max_p"),
            f"chosen_at_max_p_{MAX_P}": chosen_under_max_p(choice, MAX_P),
            f"chosen_at_max_p_{MAX_P}_holm": chosen_under_max_p(choice, MAX_P, "holm"),
            "p_holm": holm_p(choice),
            "validation": {c["name"]: round(c["accuracy"], 4) for c in choice["candidates"]},
        },
        "seconds": {node: round(r["seconds"], 1) for node, r in sorted(nodes.items())},
        "total_seconds": round(sum(r["seconds"] for r in nodes.values()), 1),
        "held_out": arms(nodes["evaluate"]["_dir"]),
        "answer_signs": answer_signs(
            nodes["evaluate"]["_dir"], nodes["mode"]["_dir"], nodes["headroom"]["_dir"]
        ),
        # the recipe's sampled node (later runs only): sampled pass@1 on the first 256
        **({"sampled": sampled_arms(nodes["sampled"]["_dir"])} if "sampled" in nodes else {}),
    }


def table(result: dict[str, Any]) -> str:
    """The held-out rows of one run as a markdown table."""
    lines = [
        "| model | greedy [95% CI] | format | vs control (won/lost, p) | vs sft (won/lost, p) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in result["held_out"]:
        greedy, control, sft = cells(r)
        lines.append(f"| {r['model']} | {greedy} | {r['format_rate']:.3f} | {control} | {sft} |")
    return "\n".join(lines)


def cells(row: dict[str, Any], value: str = "greedy_accuracy") -> list[str]:
    """One model's held-out cells of one run: its `value` (greedy accuracy, or another rate
    with a McNemar comparison) [CI], vs control, vs sft."""
    c, s = row["vs_control"], row["vs_sft"]
    return [
        f"{row[value]:.3f} [{row['ci95'][0]:.2f}, {row['ci95'][1]:.2f}]",
        f"{c['difference']:+.3f} ({c['wins']}/{c['losses']}, {c['p_value']:.2g})",
        f"{s['difference']:+.3f} ({s['wins']}/{s['losses']}, {s['p_value']:.2g})",
    ]


def sampled_table(result: dict[str, Any]) -> str:
    """The sampled rows of one run as a markdown table."""
    lines = [
        "| model | sampled pass@1 [95% CI] | vs control [95% CI] (up/down, p) | vs sft |",
        "|---|---:|---:|---:|",
    ]
    for r in result["sampled"]:
        cells = [f"{r['pass_at_1']:.3f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"]
        for c in (r["vs_control"], r["vs_sft"]):
            cells.append(
                f"{c['difference']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}] "
                f"({c['prompts_up']}/{c['prompts_down']}, {c['p_value']:.2g})"
            )
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def readme_table(results: list[dict[str, Any]]) -> str:
    """Every run's held-out rows side by side, one model a line (the README's table)."""
    head = ["greedy [95% CI]", "vs control (won/lost, p)", "vs sft"]
    return side_by_side(results, "held_out", head, cells)


def sampled_cells(row: dict[str, Any]) -> list[str]:
    """One model's sampled cells of one run: pass@1 [CI], vs control [CI] (p), vs sft (p)."""
    c, s = row["vs_control"], row["vs_sft"]
    return [
        f"{row['pass_at_1']:.3f} [{row['ci95'][0]:.2f}, {row['ci95'][1]:.2f}]",
        f"{c['difference']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}] ({c['p_value']:.2g})",
        f"{s['difference']:+.3f} ({s['p_value']:.2g})",
    ]


def readme_sampled_table(results: list[dict[str, Any]]) -> str:
    """Every run's sampled rows side by side, one model a line (the README's second table)."""
    head = ["pass@1 [95% CI]", "vs control [95% CI] (p)", "vs sft"]
    return side_by_side(results, "sampled", head, sampled_cells)


def side_by_side(
    results: list[dict[str, Any]],
    key: str,
    head: list[str],
    row_cells: Callable[[dict[str, Any]], list[str]],
) -> str:
    """A markdown table of every run's `key` rows, one model a line, each run's cells
    (`row_cells`, headed `seed N: head[0]`, then head[1:]) beside the earlier runs'."""
    columns = ["model"]
    for r in results:
        columns += [f"seed {r['data_seed']}: {head[0]}", *head[1:]]
    lines = ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    for index, row in enumerate(results[0][key]):
        line = [row["model"]]
        for r in results:
            if r[key][index]["model"] != row["model"]:
                raise ValueError(f"{r['run']}: rows in another order than {results[0]['run']}")
            line += row_cells(r[key][index])
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", required=True, help="run directories")
    parser.add_argument("--out", default="docs/results/reinforce-mode.json")
    args = parser.parse_args()
    results = [r for run in args.runs if (r := summary(Path(run)))]
    Path(args.out).write_text(json.dumps({"runs": results}, indent=2) + "\n")
    for r in results:
        print(f"\n{r['run']} (data seed {r['data_seed']}, pick chose {r['pick']['chosen']})")
        print(table(r))
        if "sampled" in r:
            print(f"\nsampled ({r['sampled'][0]['samples']} a prompt):\n{sampled_table(r)}")
    print(f"\nthe README's table:\n{readme_table(results)}")
    if all("sampled" in r for r in results):
        print(f"\nthe README's sampled table:\n{readme_sampled_table(results)}")
    print(f"\n{len(results)} runs -> {args.out}")


if __name__ == "__main__":
    main()
