"""Run a recipe's DAG node by node in its own process, without Prefect, as the flow's tasks
would (pipeline.nodes.run_node); tests kill it with SIGKILL inside a chosen node.

usage: python -m tests.integration._rounds_child RECIPE ROOT [KILL_NODE]

With KILL_NODE the process SIGKILLs itself inside that node: a training node at its first
look at the stop flag after it saved a checkpoint past step 0 (so the next run resumes from a
saved step), any other node at its second look (past its start check); a node that looks too
few times dies right after it returns (its record committed, the next node not begun).
Prints one JSON line on completion: node id -> the fingerprint of its output.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from pipeline.dag import build_dag, node_config
from pipeline.nodes import run_node
from pipeline.recipes import load_recipe
from schemas.artifacts import Artifact
from stages.core.runner import RunContext
from stages.core.sessions import StopFlag
from tests.conftest import use_session_compile_cache

KILL_AT_CHECK = 2  # a node that does not train: past its start check
TRAINING_KINDS = frozenset({"sft", "grpo", "dpo", "distill"})


class KillInside(StopFlag):
    """A stop flag that kills the process inside `node` (see the module docstring)."""

    def __init__(self, node: str | None, run_dir: Path) -> None:
        super().__init__()
        self.node = node
        self.run_dir = run_dir
        self.current = ""
        self.trains = False
        self.checks = 0

    def is_set(self) -> bool:
        if self.current == self.node:
            self.checks += 1
            if self.saved_a_step() if self.trains else self.checks >= KILL_AT_CHECK:
                kill(f"inside {self.node} at stop check {self.checks}")
        return super().is_set()

    def saved_a_step(self) -> bool:
        """A committed Orbax step past 0 under the node's checkpoints (a save in progress sits
        in a `<step>.orbax-checkpoint-tmp-*` directory until it is renamed)."""
        found = self.run_dir.glob(f"{self.node}-*/checkpoints/**/*")
        return any(p.is_dir() and p.name.isdigit() and int(p.name) > 0 for p in found)


def kill(where: str) -> None:
    print(f"KILLING MYSELF {where}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    use_session_compile_cache()
    recipe = load_recipe(argv[0], {"storage_root": argv[1]}, ())
    flag = KillInside(argv[2] if len(argv) > 2 else None, Path(argv[1]) / recipe.name)
    ctx = RunContext(root=argv[1], run=recipe.name, stop=flag)
    outputs: dict[str, Artifact] = {}
    for node in build_dag(recipe).nodes:
        flag.current, flag.trains = node.id, node.kind in TRAINING_KINDS
        inputs = {name: outputs[source] for name, source in node.inputs.items()}
        outputs[node.id] = run_node(recipe, node, node_config(recipe, node), inputs, ctx).output
        if node.id == flag.node:
            kill(f"after {node.id} returned (it looked at the stop flag {flag.checks} times)")
    print(json.dumps({n: getattr(a, "fingerprint", a.uri) for n, a in outputs.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
