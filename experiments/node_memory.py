"""Where one `far run` process's memory goes, node by node.

A reinforce-mode run on the real model was killed for memory at its 11th node
(docs/log.md, 2026-11-27): every node builds its own trainer, sampler and LoRA clone, and
what keeps them alive after the node returns decides whether a long DAG fits on a machine.

This runs a recipe's DAG in one process, node by node, as the flow's tasks do
(pipeline.nodes.run_node, one SharedBuilds for the run), without Prefect, and after each node
prints and records:

- the process's resident memory (VmRSS) and its peak so far (VmHWM), from /proc;
- JAX's live arrays: how many and their bytes, as the node left them;
- the same after `gc.collect()` (what only reference cycles kept);
- with `--clear-caches`, the same after `jax.clear_caches()` and another collection (what
  JAX's tracing and compilation caches kept: closures over a model's arrays);
- with `--malloc-trim`, the resident memory after glibc's `malloc_trim(0)` (freed memory the
  allocator still held, not returned to the system).

    JAX_PLATFORMS=cpu .venv/bin/python -m experiments.node_memory recipes/smoke.yaml --clear-caches
    flock /tmp/far-heavy.lock env JAX_PLATFORMS=cpu .venv/bin/python -m experiments.node_memory \\
        recipes/reinforce-mode.yaml --set sft.max_steps=8 ... --clear-caches --out mem.json

`--without-collect` is the before of pipeline.nodes.run_node's collection after each node:
each node's entry point is called as run_node calls it, minus that collection, and only the
"as left" numbers are taken (no collection of ours in between either), so memory grows as it
did in a run before that change.

The root is a fresh temporary directory unless --root names one (a finished node is then
skipped, as in any run, and costs nothing).
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
from pathlib import Path
from typing import Any


def proc_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def snapshot() -> dict[str, float]:
    """Resident memory and JAX's live arrays now, in MB."""
    import jax

    arrays = jax.live_arrays()
    return {
        "rss_mb": round(proc_kib("VmRSS") / 1024, 1),
        "peak_rss_mb": round(proc_kib("VmHWM") / 1024, 1),
        "live_arrays": len(arrays),
        "live_array_mb": round(sum(a.nbytes for a in arrays) / 2**20, 1),
    }


def after_node(clear_caches: bool, trim: bool) -> dict[str, dict[str, float]]:
    """The measurements taken after a node returns (see the module docstring)."""
    import ctypes

    import jax

    found = {"as_left": snapshot()}
    gc.collect()
    found["after_gc"] = snapshot()
    if clear_caches:
        jax.clear_caches()
        gc.collect()
        found["after_clear_caches"] = snapshot()
    if trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        found["after_malloc_trim"] = snapshot()
    return found


def uncollected(recipe: Any, node: Any, config: Any, inputs: Any, ctx: Any) -> Any:
    """pipeline.nodes.run_node without its collection after the node (the before)."""
    from pipeline.nodes import node_context
    from stages import registry

    return registry.spec(node.kind).entry_point()(inputs, config, node_context(recipe, node, ctx))


def run(
    recipe_path: str, root: str, assignments: list[str], clear: bool, trim: bool, collect: bool
) -> list[dict[str, Any]]:
    from pipeline.dag import build_dag, node_config
    from pipeline.nodes import run_node
    from pipeline.recipes import load_recipe
    from schemas.artifacts import Artifact
    from stages.core.runner import RunContext
    from stages.core.shared import SharedBuilds

    recipe = load_recipe(recipe_path, {"storage_root": root}, assignments)
    ctx = RunContext(root=root, run=recipe.name, shared=SharedBuilds())
    step = run_node if collect else uncollected
    measure = (lambda: after_node(clear, trim)) if collect else (lambda: {"as_left": snapshot()})
    outputs: dict[str, Artifact] = {}
    rows: list[dict[str, Any]] = [{"node": "(start)", "kind": "-", **measure()}]
    for node in build_dag(recipe).nodes:
        inputs = {name: outputs[source] for name, source in node.inputs.items()}
        outputs[node.id] = step(recipe, node, node_config(recipe, node), inputs, ctx).output
        rows.append({"node": node.id, "kind": node.kind, **measure()})
        print(line(rows[-1]), flush=True)
    return rows


def line(row: dict[str, Any]) -> str:
    parts = [f"{row['node']:>12} ({row['kind']})"]
    for when in ("as_left", "after_gc", "after_clear_caches", "after_malloc_trim"):
        if when in row:
            s = row[when]
            parts.append(
                f"{when}: rss {s['rss_mb']:.0f} MB, {s['live_arrays']} arrays "
                f"{s['live_array_mb']:.0f} MB"
            )
    parts.append(f"peak {row['as_left']['peak_rss_mb']:.0f} MB")
    return " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="a recipe file, e.g. recipes/smoke.yaml")
    parser.add_argument("--set", action="append", default=[], help="FIELD=VALUE, repeatable")
    parser.add_argument("--root", help="storage root (default: a fresh temporary directory)")
    parser.add_argument(
        "--clear-caches", action="store_true", help="also measure after jax.clear_caches()"
    )
    parser.add_argument(
        "--malloc-trim", action="store_true", help="also measure after glibc's malloc_trim(0)"
    )
    parser.add_argument(
        "--without-collect",
        action="store_true",
        help="the before: no collection after a node (see above)",
    )
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="far-node-memory-")
    rows = run(
        args.recipe,
        root,
        args.set,
        args.clear_caches,
        args.malloc_trim,
        not args.without_collect,
    )
    if args.out:
        found = {"recipe": args.recipe, "collect": not args.without_collect, "rows": rows}
        Path(args.out).write_text(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
