"""Where a model's worked chain first goes wrong, per model and held-out level of a run.

Each completion's steps are read back in the chain format of stages/data_prep/chains.py
("a op b = c.", "a op (b) = c.", "-(x) = y.") and matched against the exact chain of the
prompt's expression: a step is on the chain when it equals a gold step not yet used (so a
valid reordering, such as a product taken before the sum on its left, counts). The first step
off the chain is a slip when some unused gold step has its operation and operands (the value
is wrong), and a wrong step otherwise (an operand dropped, taken from the wrong place, or an
operation the expression does not have). A completion whose steps all lie on the chain but
that answers before the last one stopped early. Nothing is generated: it reads an evaluate
node's samples.jsonl and its run's data_prep prompts.

    python -m experiments.chain_errors /work/exp/runs/reinforce-generalize le_k k1 k2
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from stages.core import stats
from stages.data_prep.chains import NotAChain, Step, steps

_NUMBER = r"\(?-?\d+\)?"
_STEP = re.compile(rf"-\((-?\d+)\) = (-?\d+)\.|({_NUMBER}) ([-+*/]) ({_NUMBER}) = (-?\d+)")
_EXPRESSION = re.compile(r"Calculate (.*)\.<end_of_turn>")
KINDS = (
    "right",
    "stopped early",
    "slip",
    "wrong step",
    "all steps right, answer wrong",
    "no chain",
)


def written_steps(completion: str) -> list[Step]:
    """The steps a completion writes inside its reasoning, in order."""
    found = re.search(r"<reasoning>(.*?)</reasoning>", completion, re.S)
    body = found.group(1) if found else completion
    out = []
    for m in _STEP.finditer(body):
        if m.group(1) is not None:
            out.append(Step("neg", None, int(m.group(1)), int(m.group(2))))
        else:
            left, op, right = (m.group(3).strip("()"), m.group(4), m.group(5).strip("()"))
            out.append(Step(op, int(left), int(right), int(m.group(6))))
    return out


def first_error(written: list[Step], gold: list[Step]) -> tuple[str, int]:
    """Which kind of error the first step off the gold chain is ("" when none is), and how
    many steps the completion wrote on the chain before it."""
    unused = list(gold)
    for done, step in enumerate(written):
        if step in unused:
            unused.remove(step)
            continue
        same = [g for g in unused if (g.op, g.left, g.right) == (step.op, step.left, step.right)]
        return ("slip" if same else "wrong step"), done
    return ("stopped early" if unused else ""), len(written)


def kind(row: dict, gold: list[Step]) -> tuple[str, float]:
    """The completion's kind, and the fraction of the gold chain it wrote before leaving it."""
    if float(row["correct"]) == 1.0:
        return "right", 1.0
    written = written_steps(row["completion"])
    if not written:
        return "no chain", 0.0
    error, done = first_error(written, gold)
    return (error or "all steps right, answer wrong"), min(done / max(len(gold), 1), 1.0)


def read(run: Path, level: str) -> dict[str, dict[str, tuple[str, float]]]:
    """Each model's completions at `level`: prompt id -> (kind, chain fraction)."""
    prompts = {}  # the held-out split's prompts and the validation split's
    for split in run.glob("data_prep-*/*_prompts.jsonl"):
        for line in split.open():
            row = json.loads(line)
            prompts[row["id"]] = row
    out: dict[str, dict[str, tuple[str, float]]] = collections.defaultdict(dict)
    for line in next(run.glob(f"{level}-*/samples.jsonl")).open():
        row = json.loads(line)
        expression = _EXPRESSION.search(prompts[row["id"]]["prompt"])
        try:
            gold, _ = steps(expression.group(1)) if expression else ([], 0)
        except NotAChain:
            gold = []
        out[row["model"]][row["id"]] = kind(row, gold)
    return out


def table(run: Path, level: str, baseline: str) -> dict[str, dict[str, Any]]:
    """Per model: the share of each kind, the mean chain fraction, and that fraction paired
    against `baseline`'s on the same prompts (mean difference, 95% interval, sign-flip p)."""
    models = read(run, level)
    ids = sorted(models[baseline])
    base = np.array([[models[baseline][i][1]] for i in ids])
    out = {}
    for model, rows in models.items():
        kinds = collections.Counter(k for k, _ in rows.values())
        mine = np.array([[rows[i][1]] for i in ids])
        paired = stats.paired_rates(base, mine)
        out[model] = {
            "prompts": len(rows),
            "kinds": {k: round(kinds.get(k, 0) / len(rows), 4) for k in KINDS},
            "chain_fraction": round(float(mine.mean()), 4),
            f"chain_fraction_vs_{baseline}": {
                "difference": round(paired.candidate_rate - paired.baseline_rate, 4),
                "ci95": [round(paired.ci_low, 4), round(paired.ci_high, 4)],
                "p_value": paired.p_value,
            },
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run directory with data_prep and evaluate nodes")
    parser.add_argument("levels", nargs="+", help="evaluate node names, e.g. le_k k1 k2")
    parser.add_argument("--baseline", default="control", help="the model others are paired with")
    parser.add_argument("--json", type=Path, help="also write the tables here")
    args = parser.parse_args()
    result = {level: table(args.run, level, args.baseline) for level in args.levels}
    for level, models in result.items():
        print(f"\n{level}: completions by their first error; the gold chain written before it")
        head = ["model", "n", *KINDS, "chain written", f"vs {args.baseline} [95% CI] (p)"]
        print("| " + " | ".join(head) + " |")
        print("|---|" + "---:|" * (len(head) - 1))
        for model, row in models.items():
            paired = row[f"chain_fraction_vs_{args.baseline}"]
            low, high = paired["ci95"]
            cells = [
                model,
                str(row["prompts"]),
                *(f"{row['kinds'][k]:.3f}" for k in KINDS),
                f"{row['chain_fraction']:.3f}",
                f"{paired['difference']:+.3f} [{low:+.3f}, {high:+.3f}] ({paired['p_value']:.2g})",
            ]
            print("| " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
