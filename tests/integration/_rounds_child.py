"""Run a recipe's DAG node by node in its own process, without Prefect, as the flow's tasks
would (pipeline.nodes.run_node); tests kill it with SIGKILL inside a chosen node.

usage: python -m tests.integration._rounds_child RECIPE ROOT [KILL_NODE]

With KILL_NODE the process SIGKILLs itself inside that node, at the node's third look at the
stop flag (past its start check and its first steps or chunks, a saved checkpoint behind it
where the node trains), or, for a node that looks fewer times, right after it returns (its
record committed, the next node not begun). Prints one JSON line on completion: node id ->
the fingerprint of its output.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from pipeline.dag import build_dag, node_config
from pipeline.nodes import run_node
from pipeline.recipes import load_recipe
from schemas.artifacts import Artifact
from stages.core.runner import RunContext
from stages.core.sessions import StopFlag
from tests.conftest import use_session_compile_cache

KILL_AT_CHECK = 3


class KillInside(StopFlag):
    """A stop flag that kills the process at the KILL_AT_CHECK-th check inside `node`."""

    def __init__(self, node: str | None) -> None:
        super().__init__()
        self.node = node
        self.current = ""
        self.checks = 0

    def is_set(self) -> bool:
        if self.current == self.node:
            self.checks += 1
            if self.checks >= KILL_AT_CHECK:
                kill(f"inside {self.node} at stop check {self.checks}")
        return super().is_set()


def kill(where: str) -> None:
    print(f"KILLING MYSELF {where}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    use_session_compile_cache()
    recipe = load_recipe(argv[0], {"storage_root": argv[1]}, ())
    flag = KillInside(argv[2] if len(argv) > 2 else None)
    ctx = RunContext(root=argv[1], run=recipe.name, stop=flag)
    outputs: dict[str, Artifact] = {}
    for node in build_dag(recipe).nodes:
        flag.current = node.id
        inputs = {name: outputs[source] for name, source in node.inputs.items()}
        outputs[node.id] = run_node(recipe, node, node_config(recipe, node), inputs, ctx).output
        if node.id == flag.node:
            kill(f"after {node.id} returned (it looked at the stop flag {flag.checks} times)")
    print(json.dumps({n: getattr(a, "fingerprint", a.uri) for n, a in outputs.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
