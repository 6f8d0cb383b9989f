"""Where a LoRA train step's time goes, op by op: an XLA trace of SFT's loss gradient.

Builds a recipe's model with its LoRA adapters, compiles the gradient of SFT's loss (as the
stage trains it: tunix_compat.target_positions_loss at the recipe's shapes) with respect to
the adapters, runs it under jax.profiler and sums each compiled op's time over the steps,
grouped by the op's kind and the JAX operation it came from (HLO metadata; layer numbers
folded). The table is thread time per step: XLA CPU runs independent ops on two threads at
once, so its total exceeds the step's wall time. `--qwix-backward` restores qwix's own LoRA
backward (without the fast path "lora_backward") to show what it cost.

    JAX_PLATFORMS=cpu .venv/bin/python -m bench.train_step_profile --recipe recipes/demo.yaml

The compiled step's memory (XLA's temporaries, beside the weights it reads) is printed too.
GRPO's actor update is the same gradient at its shapes (rows = prompts x generations,
positions = prompt + completion, the completion's in the loss): on reinforce-mode,
`--rows 32 --length 96 --targets 32` against `--rows 8` (train_micro_batch_size 1).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def build(recipe_name: str, cache: str, rows: int, length: int, targets: int) -> tuple[Any, ...]:
    """The jitted loss gradient and its arguments, on a LoRA clone of the recipe's model."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from stages.modeling import models, tunix_compat
    from tests.conftest import recipe_with

    recipe = recipe_with(tempfile.mkdtemp(prefix="far-profile-"), recipe_name)
    mesh = models.build_mesh(recipe.mesh)
    network = models.apply_lora(
        models.build_base_model(recipe.model, mesh, cache), recipe.sft.lora, mesh
    )
    graphdef, adapters, frozen = nnx.split(network, nnx.LoRAParam, ...)
    tokens = jax.random.randint(jax.random.key(0), (rows, length), 2, 1000)
    positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)
    mask = jnp.broadcast_to(
        jnp.tril(jnp.ones((length, length), bool))[None], (rows, length, length)
    )
    in_loss = jnp.broadcast_to(
        (jnp.arange(length) >= length - targets).astype(jnp.int32), tokens.shape
    )
    loss_fn = tunix_compat.target_positions_loss(targets)

    def loss(trained: Any, frozen: Any) -> Any:
        model = nnx.merge(graphdef, nnx.merge_state(trained, frozen))
        return loss_fn(model, tokens, in_loss, positions, mask)

    return mesh, jax.jit(jax.grad(loss)), adapters, frozen


def op_origins(hlo: str) -> dict[str, tuple[str, str]]:
    """Each compiled op's result shape and the JAX operation it came from."""
    found = re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) .*?op_name=\"([^\"]*)\"", hlo, re.M)
    return {m.group(1): (m.group(2), re.sub(r"layer_\d+", "layer_N", m.group(3))) for m in found}


def trace_totals(trace_dir: str, origins: dict[str, tuple[str, str]]) -> collections.Counter:
    """Seconds per (op kind, result shape, JAX operation), summed over XLA's threads."""
    from jax.profiler import ProfileData

    (path,) = glob.glob(f"{trace_dir}/plugins/profile/*/*.xplane.pb")
    totals: collections.Counter = collections.Counter()
    for plane in ProfileData.from_file(path).planes:
        for line in plane.lines:
            if "XLA" not in line.name:
                continue
            for event in line.events:
                if event.name.startswith(("ThunkExecutor", "SlinkyThreadPool")):
                    continue
                shape, origin = origins.get(event.name, ("?", "?"))
                totals[(re.sub(r"\.\d+$", "", event.name), shape, origin)] += (
                    event.duration_ns / 1e9
                )
    return totals


def print_ops(totals: collections.Counter, top: int, per: int = 1, label: str = "s") -> None:
    """The `top` ops of trace_totals' table, their seconds divided by `per`."""
    print(f"{label:>8} {'op':<22} {'result':<24} JAX operation")
    for (kind, shape, origin), total in totals.most_common(top):
        print(f"{total / per:8.3f} {kind[:22]:<22} {shape[:24]:<24} {origin[-80:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="demo")
    parser.add_argument("--rows", type=int, default=4, help="the SFT batch (demo: 4)")
    parser.add_argument("--length", type=int, default=96, help="positions a row (demo: 96)")
    parser.add_argument("--targets", type=int, default=36, help="loss positions a row (demo: 36)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--qwix-backward", action="store_true", help="qwix's own LoRA backward")
    parser.add_argument("--cache-dir", default=os.environ.get("FAR_CACHE_DIR"))
    args = parser.parse_args()
    import jax

    from stages.modeling import fast_paths

    if not args.qwix_backward:  # FAR's LoRA backward for the script's life, as a stage has it
        contextlib.ExitStack().enter_context(fast_paths.installed("lora_backward"))
    cache = args.cache_dir or str(Path.home() / ".cache" / "far")
    mesh, step, adapters, frozen = build(
        Path(args.recipe).stem, cache, args.rows, args.length, args.targets
    )
    with mesh:
        compiled = step.lower(adapters, frozen).compile()
        origins = op_origins(compiled.as_text())
        memory = compiled.memory_analysis()
        jax.block_until_ready(step(adapters, frozen))
        seconds = []
        for _ in range(args.steps):
            started = time.perf_counter()
            jax.block_until_ready(step(adapters, frozen))
            seconds.append(time.perf_counter() - started)
        with tempfile.TemporaryDirectory(prefix="far-trace-") as trace_dir:
            jax.profiler.start_trace(trace_dir)
            for _ in range(args.steps):
                jax.block_until_ready(step(adapters, frozen))
            jax.profiler.stop_trace()
            totals = trace_totals(trace_dir, origins)
    wall, threads = statistics.median(seconds), sum(totals.values()) / args.steps
    print(
        f"{args.recipe}: SFT loss gradient, {args.rows} x {args.length} positions, "
        f"{args.targets} in the loss; wall {wall:.3f} s a step (median of {args.steps}, "
        f"untraced); thread time {threads:.3f} s"
    )
    if memory is not None:  # None where the backend does not report it
        print(
            f"memory: {memory.temp_size_in_bytes / 1e9:.2f} GB of XLA temporaries, "
            f"{memory.argument_size_in_bytes / 1e9:.2f} GB of arguments"
        )
    print_ops(totals, args.top, per=args.steps, label="s/step")


if __name__ == "__main__":
    main()
