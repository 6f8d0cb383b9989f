"""Where GRPO's actor update goes, op by op: an XLA trace of one real actor update.

bench/train_step_profile.py traces a stand-in (SFT's loss gradient at the actor's shapes);
this traces the GRPO stage itself. It runs data_prep, a short SFT and GRPO through FAR's
stages (bench/grpo_phases.run_stages), starts jax.profiler around the `--call`-th actor update
(the first one compiles) and sums each compiled op of Tunix's train step by kind, result
shape and the JAX operation it came from (the step's optimized HLO, dumped with
`--xla_dump_to`; layer numbers folded). Thread time: XLA CPU runs independent ops on two
threads at once, so its total exceeds the update's wall time.

    flock /tmp/far-heavy.lock env JAX_PLATFORMS=cpu .venv/bin/python -m bench.grpo_trace \\
        --recipe reinforce-headroom --sft-steps 2 --grpo-steps 4

This is how Tunix's entropy metric was found to pay a second, positions-major projection of
the completion (docs/performance.md, GRPO's entropy metric).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def traced_updates(call: int, trace_dir: str) -> tuple[Any, list[float]]:
    """Make every GRPO run from now on trace its `call`-th actor update into `trace_dir`;
    returns the patched instrument function and the list the updates' wall times go to."""
    import jax

    from stages.grpo import timing, training

    walls: list[float] = []
    instrument = timing.instrument

    def tracing(cluster: Any, learner: Any) -> Any:
        timer = instrument(cluster, learner)
        update = cluster.update_actor  # already timed by the phase timer

        def traced(*args: Any, **kwargs: Any) -> Any:
            on = len(walls) + 1 == call
            if on:
                jax.profiler.start_trace(trace_dir)
            started = time.perf_counter()
            try:
                return update(*args, **kwargs)
            finally:
                walls.append(time.perf_counter() - started)
                if on:
                    jax.profiler.stop_trace()

        cluster.update_actor = traced
        return timer

    training.timing.instrument = tracing
    return tracing, walls


def train_step_origins(dump_dir: str) -> dict[str, tuple[str, str]]:
    """Op name -> (result shape, JAX operation) in the last compiled train step."""
    from bench.train_step_profile import op_origins

    steps = sorted(glob.glob(f"{dump_dir}/*train_step*after_optimizations.txt"))
    if not steps:
        raise SystemExit(f"no compiled train step was dumped to {dump_dir}")
    return op_origins(Path(steps[-1]).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="reinforce-headroom")
    parser.add_argument("--sft-steps", type=int, default=2)
    parser.add_argument("--grpo-steps", type=int, default=4)
    parser.add_argument(
        "--call", type=int, default=3, help="which actor update to trace (1: compiles)"
    )
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--cache-dir", default=os.environ.get("FAR_CACHE_DIR"))
    args = parser.parse_args()
    if not 1 <= args.call <= args.grpo_steps:
        print(
            f"grpo_trace: --call {args.call}: expected 1 to {args.grpo_steps} (--grpo-steps)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    work = tempfile.mkdtemp(prefix="far-grpo-trace-")
    dump_dir, trace_dir = f"{work}/hlo", f"{work}/trace"
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump_dir} --xla_dump_hlo_as_text"
    )  # read when JAX's backend starts, after this
    from bench import grpo_phases
    from bench.train_step_profile import print_ops, trace_totals

    _, walls = traced_updates(args.call, trace_dir)
    grpo_phases.run_stages(Path(args.recipe).stem, args.sft_steps, args.grpo_steps, args.cache_dir)
    totals = trace_totals(trace_dir, train_step_origins(dump_dir))  # '?': not the step's
    print(f"{args.recipe}: actor updates' wall seconds {[round(w, 2) for w in walls]}")
    print(
        f"update {args.call} traced: thread time {sum(totals.values()):.2f} s "
        f"(HLO and trace in {work})"
    )
    print_ops(totals, args.top, label="thread s")


if __name__ == "__main__":
    main()
