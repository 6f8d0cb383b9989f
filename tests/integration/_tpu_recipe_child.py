"""Run a TPU recipe scaled to the tiny model (tests/scaled_recipes.py) in its own process, with
as many CPU devices as the recipe's mesh names (the test sets XLA_FLAGS), so tests can
give it a mesh, stop it, or kill it.

usage: python -m tests.integration._tpu_recipe_child MODE NAME ROOT XLA_CACHE [options]

  full                          data_prep -> sft -> grpo -> evaluate (the recipe's full run:
                                tests/scaled_recipes.py's FULL_RUN_CHANGES)
  sft DATASET_RECORD [--stop-after N]
                                SFT on a prepared dataset; --stop-after requests a stop (as
                                SIGTERM does) when micro-batch N+1 is read, after N were
                                handed to the trainer
  grpo DATASET_RECORD SFT_RECORD [--num-iterations K]
                                GRPO from an SFT checkpoint (K overrides the recipe's)

Prints `RECORD <stage> <uri>` per stage run; exits 3 when the session stopped early.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from schemas.record import StageRecord
from stages import sft
from stages.core import storage
from stages.core.runner import RunContext, SessionExpired
from stages.core.sessions import StopFlag
from stages.data_prep import build as data_prep
from stages.evaluate import evaluation as evaluate
from stages.grpo import training as grpo
from stages.modeling import compile_cache
from tests.scaled_recipes import full_run, scaled

EXIT_SESSION_ENDED = 3
RUN = "child"


def output_of(record_uri: str) -> Any:
    return StageRecord.model_validate(storage.read_json(record_uri)).output


def full(name: str, root: str) -> None:
    recipe = full_run(name, root)
    ctx = RunContext(root=root, run=RUN)
    prepared = data_prep.prepare(recipe.data, recipe.model, ctx)
    print(f"RECORD data_prep {prepared.record_uri}", flush=True)
    trained = sft.train(prepared.output, recipe.sft, recipe.model, recipe.mesh, ctx)
    print(f"RECORD sft {trained.record_uri}", flush=True)
    reinforced = grpo.reinforce(
        prepared.output, trained.output, recipe.grpo, recipe.model, recipe.mesh, ctx
    )
    print(f"RECORD grpo {reinforced.record_uri}", flush=True)
    checkpoints = {"sft": trained.output, "grpo": reinforced.output}
    report = evaluate.evaluate(
        prepared.output, checkpoints, recipe.eval, recipe.model, recipe.mesh, ctx
    )
    print(f"RECORD evaluate {report.record_uri}", flush=True)


class StopAfter:
    """`items`, requesting a stop on `flag` as item number `after` (0-based) is read."""

    def __init__(self, items: Any, after: int, flag: StopFlag) -> None:
        self.items, self.after, self.flag = items, after, flag

    def __iter__(self) -> Iterator[Any]:
        for number, item in enumerate(self.items):
            if number == self.after:
                print(f"STOP REQUESTED after {number} micro-batches", flush=True)
                self.flag.request("test: stop inside an accumulation window")
            yield item


def sft_only(name: str, root: str, dataset_record: str, stop_after: int | None) -> None:
    recipe = scaled(name, root)
    flag = StopFlag()
    if stop_after is not None:
        make_stream = sft.in_memory_stream
        sft.in_memory_stream = lambda data: iter(StopAfter(make_stream(data), stop_after, flag))  # type: ignore[assignment]
    ctx = RunContext(root=root, run=RUN, stop=flag)
    trained = sft.train(output_of(dataset_record), recipe.sft, recipe.model, recipe.mesh, ctx)
    print(f"RECORD sft {trained.record_uri}", flush=True)


def grpo_only(
    name: str, root: str, dataset_record: str, sft_record: str, num_iterations: int | None
) -> None:
    changes = {"grpo": {"num_iterations": num_iterations}} if num_iterations else {}
    recipe = scaled(name, root, **changes)
    ctx = RunContext(root=root, run=RUN)
    dataset, policy = output_of(dataset_record), output_of(sft_record)
    reinforced = grpo.reinforce(dataset, policy, recipe.grpo, recipe.model, recipe.mesh, ctx)
    print(f"RECORD grpo {reinforced.record_uri}", flush=True)


def option(argv: list[str], flag: str) -> int | None:
    return int(argv[argv.index(flag) + 1]) if flag in argv else None


def main(argv: list[str]) -> int:
    mode, name, root, cache = argv[:4]
    compile_cache.enable(cache)  # the test session's cache: its executables load, not compile
    try:
        if mode == "full":
            full(name, root)
        elif mode == "sft":
            sft_only(name, root, argv[4], option(argv, "--stop-after"))
        elif mode == "grpo":
            grpo_only(name, root, argv[4], argv[5], option(argv, "--num-iterations"))
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    except SessionExpired as e:
        print(f"SESSION ENDED: {e}", flush=True)
        return EXIT_SESSION_ENDED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
