"""Where a GRPO step's time goes, phase by phase (stages/grpo/timing.py), on a recipe's model.

Runs data_prep, a short SFT and GRPO through FAR's stages and prints, from the GRPO record's
history, each step's seconds per phase and each phase's share of the timed time over the
steps after the first (the first one compiles). bench/roofline.py runs the same stages
(`run_stages`) and sets each phase's time against the machine's bound.

    JAX_PLATFORMS=cpu .venv/bin/python -m bench.grpo_phases                       # smoke
    flock /tmp/far-heavy.lock env JAX_PLATFORMS=cpu .venv/bin/python -m bench.grpo_phases \
        --recipe demo --sft-steps 2 --grpo-steps 4                     # the real Gemma 3 270M

`--compare KEY=VALUE` (repeatable; grpo fields, VALUE read as YAML) measures two settings in
one run: after data_prep and SFT, GRPO runs from the same SFT policy first as the recipe says
("before"), then with the changed fields ("after"), each in its own stage root (so neither
reuses the other's result), with the same sampling seeds; `--reps N` runs N such pairs in
A B, B A order (in one process the second GRPO run reads faster, whatever it runs).
It prints each arm's phases, completions per second over the timed steps after the first, the
informative-group fraction, the process's peak resident memory during that GRPO run, and
after / before.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# tests.conftest.recipe_with: a recipe with fields replaced. Appended, not put first: when
# bench/roofline.py measures a baseline tree it has put that tree first, and this module must
# not put the current tree's stages ahead of it (it did: the --baseline run measured this code).

SECONDS_PREFIX = "far/seconds/"  # stages/grpo/timing.PREFIX (kept here: older trees import it)


def proc_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_rss_mb(measure: Callable[[], Any]) -> tuple[Any, float]:
    """measure()'s result and the process's peak resident memory while it ran, in MB: the
    peak (VmHWM) is reset first by writing 5 to /proc/self/clear_refs (Linux), so each GRPO
    run of one process gets its own; NaN where /proc cannot do that."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return measure(), float("nan")
    result = measure()
    return result, proc_kib("VmHWM") / 1024


def run_stages(
    recipe_name: str,
    sft_steps: int,
    grpo_steps: int,
    cache_dir: str | None,
    between: Callable[[str, Any], None] | None = None,
    arms: Sequence[Mapping[str, Any]] = (),
    grpo_changes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """data_prep, SFT and GRPO of `recipe_name` through FAR's stages in a temporary root.

    `between(stage, recipe)` runs before "sft", before "grpo" and after it ("end"), outside
    any stage's clock. Returns the recipe, the dataset artifact, the SFT record's metrics, the
    GRPO record's history, the real prompt lengths of the GRPO split in tokens, and the most
    SFT loss targets a row holds. `arms`: after that GRPO, one more GRPO from the same SFT
    policy per entry, with those grpo fields changed, each in a root of its own; their
    histories are "arm_histories", in order. "grpo_peak_rss_mb": the process's peak resident
    memory during each GRPO run (the first, then each arm's). `grpo_changes`: grpo fields set
    in every GRPO run here (bench/roofline.py's --grpo: a setting only this tree's code has)."""
    from schemas.record import StageRecord
    from stages import sft
    from stages.core import datasets, storage
    from stages.core.runner import RunContext

    try:
        from stages.data_prep import build as data_prep
        from stages.grpo import training as grpo
    except ImportError:  # a baseline tree from before the modules were named (bench --baseline)
        from stages import data_prep, grpo  # type: ignore[no-redef]
    from stages.modeling.tokenizers import build_tokenizer
    from tests.conftest import recipe_with

    def mark(stage: str) -> None:
        if between is not None:
            between(stage, recipe)

    with tempfile.TemporaryDirectory(prefix="far-grpo-phases-") as tmp:
        recipe = recipe_with(
            tmp,
            recipe_name,
            sft={"max_steps": sft_steps},
            grpo={**(grpo_changes or {}), "max_steps": grpo_steps},
        )
        ctx = RunContext(tmp, "phases", cache_dir=cache_dir)
        dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
        tokenizer = build_tokenizer(recipe.model, ctx.model_cache)
        prompts = datasets.load_prompts(dataset, "grpo_train")
        prompt_lengths = [len(tokenizer.encode(row["prompt"])) for row in prompts]
        loss_mask = datasets.load_sft_arrays(dataset)["input_mask"][:, 1:]
        mark("sft")
        sft_out = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx)
        sft_record = StageRecord.model_validate(storage.read_json(sft_out.record_uri))
        mark("grpo")
        out, peak = peak_rss_mb(
            lambda: grpo.reinforce(
                dataset, sft_out.output, recipe.grpo, recipe.model, recipe.mesh, ctx
            )
        )
        history = StageRecord.model_validate(storage.read_json(out.record_uri)).history
        arm_histories, peaks = [], [peak]
        for index, changes in enumerate(arms):
            config = type(recipe.grpo).model_validate({**recipe.grpo.model_dump(), **changes})
            arm_ctx = RunContext(os.path.join(tmp, f"arm{index}"), "phases", cache_dir=cache_dir)
            arm, peak = peak_rss_mb(
                lambda config=config, arm_ctx=arm_ctx: grpo.reinforce(
                    dataset, sft_out.output, config, recipe.model, recipe.mesh, arm_ctx
                )
            )
            record = StageRecord.model_validate(storage.read_json(arm.record_uri))
            arm_histories.append(record.history)
            peaks.append(peak)
        mark("end")
    return {
        "recipe": recipe,
        "dataset": dataset,
        "sft_metrics": dict(sft_record.metrics),
        "grpo_history": history,
        "prompt_lengths": prompt_lengths,
        "sft_targets": int(loss_mask.sum(axis=1).max()),
        "arm_histories": arm_histories,
        "grpo_peak_rss_mb": peaks,
    }


def phase_seconds(history: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each timed GRPO phase's seconds per step, from the record's history."""
    return {k.removeprefix(SECONDS_PREFIX): v for k, v in history.items() if SECONDS_PREFIX in k}


INFORMATIVE = "far/informative_groups"  # stages/grpo/metrics.INFORMATIVE
UPDATE_INFORMATIVE = "far/update_informative_groups"  # stages/grpo/metrics: oversample


def update_informative(fraction: float, groups: int, skip_flat: bool) -> float:
    """The informative share of the groups the actor update runs over, from a step's
    informative-group fraction: all groups, or with skip_flat_groups the informative ones
    filled with flat ones up to a power of two (stages/grpo/advantages.informative_rows)."""
    informative = round(fraction * groups)
    kept = min(groups, 1 << max(0, informative - 1).bit_length()) if skip_flat else groups
    return informative / kept


def arm_summary(
    history: dict[str, list[float]], grpo: Any, skip_flat: bool = False
) -> dict[str, Any]:
    """One GRPO run's mean seconds per phase, completions per second (timed seconds) and
    informative-group fraction (of the step's groups, and of the groups the actor update
    runs over) over the steps after the first (the first one compiles). With grpo.oversample
    a step rolls out oversample x batch_size groups and trains on batch_size of them:
    `completions_per_s` counts those rolled out, `trained_completions_per_s` those trained on,
    and the update's share starts from the kept groups' share the stage logs."""
    trained_per_step = grpo.batch_size * grpo.num_generations
    completions_per_step = trained_per_step * getattr(grpo, "oversample", 1)
    phases = {name: values[1:] for name, values in phase_seconds(history).items()}
    steps = max((len(values) for values in phases.values()), default=0)
    if steps == 0:
        raise ValueError("a GRPO arm needs at least 2 steps to time one after compiling")
    step_seconds = sum(sum(values) for values in phases.values()) / steps
    # a step that compiles a new shape of the actor's step (trim_padding, skip_flat_groups)
    # counts in the mean; the median shows the steps that did not
    totals = sorted(sum(v[i] for v in phases.values() if i < len(v)) for i in range(steps))
    median = (totals[(steps - 1) // 2] + totals[steps // 2]) / 2
    later = history.get(INFORMATIVE, [])[1:]
    kept = history.get(UPDATE_INFORMATIVE, [])[1:] or later  # oversample: the kept groups'
    return {
        "phases": {name: sum(values) / steps for name, values in phases.items()},
        "step_seconds": step_seconds,
        "completions_per_s": completions_per_step / step_seconds,
        "trained_completions_per_s": trained_per_step / step_seconds,
        "median_step_seconds": median,
        "median_completions_per_s": completions_per_step / median,
        "informative_groups": sum(later) / len(later) if later else float("nan"),
        "update_informative": (
            sum(update_informative(f, grpo.batch_size, skip_flat) for f in kept) / len(kept)
            if kept
            else float("nan")
        ),
        "completion_max_length": history.get("completions/max_length", [])[1:],
    }


def parse_changes(pairs: Sequence[str]) -> dict[str, Any]:
    """--compare's KEY=VALUE pairs as grpo fields (VALUE read as YAML: 8, null, true)."""
    import yaml

    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"wanted KEY=VALUE (a grpo field), got {pair!r}")
        changes[key] = yaml.safe_load(value)
    return changes


def print_steps(title: str, history: dict[str, list[float]]) -> None:
    phases = phase_seconds(history)
    steps = max((len(v) for v in phases.values()), default=0)
    print(f"\n{title}: GRPO seconds per step and phase (load average {os.getloadavg()})")
    print("phase             " + " ".join(f"step {i:>3}" for i in range(steps)))
    for phase, values in phases.items():
        print(f"{phase:<17} " + " ".join(f"{v:8.3f}" for v in values))


def compare(
    args: argparse.Namespace, changes: dict[str, Any]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """`args.reps` (before, after) pairs from one SFT policy, in A B, B A order (the first
    before is run_stages' own GRPO): in one process the second GRPO run's actor update reads
    1.5-2 s lower whatever it runs (sessions 19 and 20), so neither setting always goes second."""
    is_after = [(i % 2 == 1) != (i // 2 % 2 == 1) for i in range(2 * args.reps)]  # B A, A B, ...
    arms: list[Mapping[str, Any]] = [changes if after else {} for after in is_after[1:]]
    run = run_stages(args.recipe, args.sft_steps, args.grpo_steps, args.cache_dir, arms=arms)
    grpo = run["recipe"].grpo
    per_step = grpo.batch_size * grpo.num_generations
    histories = [run["grpo_history"], *run["arm_histories"]]
    peaks = run["grpo_peak_rss_mb"]
    pairs = []
    for rep in range(args.reps):
        first, second = 2 * rep, 2 * rep + 1
        b, a = (second, first) if is_after[first] else (first, second)
        before, after = histories[b], histories[a]
        print_steps(f"{args.recipe}, pair {rep}, before", before)
        print_steps(f"{args.recipe}, pair {rep}, after ({changes})", after)
        skip = bool(changes.get("skip_flat_groups", grpo.skip_flat_groups))
        summaries = arm_summary(before, grpo, grpo.skip_flat_groups), arm_summary(after, grpo, skip)
        for summary, peak in zip(summaries, (peaks[b], peaks[a]), strict=True):
            summary["peak_rss_mb"] = peak
        pairs.append(summaries)
    print(f"\n{args.recipe}: {per_step} completions a step; steps 1-{args.grpo_steps - 1} of each")
    for rep, (before, after) in enumerate(pairs):
        names = list(dict.fromkeys([*before["phases"], *after["phases"]]))
        print(f"pair {rep} ({'after' if rep % 2 else 'before'} ran first)   before     after")
        for name in names:
            b, a = before["phases"].get(name, 0.0), after["phases"].get(name, 0.0)
            print(f"  {name:<17} {b:8.3f}  {a:8.3f}")
        for key in (
            "step_seconds",
            "completions_per_s",
            "median_step_seconds",
            "median_completions_per_s",
            "informative_groups",
            "update_informative",
            "peak_rss_mb",
        ):
            print(f"  {key:<17} {before[key]:8.3f}  {after[key]:8.3f}")
        print(f"  completions/max_length before {before['completion_max_length']}")
        print(f"  completions/max_length after  {after['completion_max_length']}")
        ratio = after["completions_per_s"] / before["completions_per_s"]
        median = after["median_completions_per_s"] / before["median_completions_per_s"]
        print(f"  completions/s after / before: {ratio:.3f} (mean), {median:.3f} (median)")
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument("--sft-steps", type=int, default=4)
    parser.add_argument("--grpo-steps", type=int, default=6)
    parser.add_argument("--cache-dir", default=os.environ.get("FAR_CACHE_DIR"))
    parser.add_argument("--compare", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--reps", type=int, default=1, help="(before, after) pairs, --compare")
    args = parser.parse_args()
    if args.compare:
        compare(args, parse_changes(args.compare))
        return

    run = run_stages(args.recipe, args.sft_steps, args.grpo_steps, args.cache_dir)
    phases = phase_seconds(run["grpo_history"])
    print_steps(args.recipe, run["grpo_history"])
    later = {phase: sum(values[1:]) for phase, values in phases.items()}
    total = sum(later.values())
    print(f"\nsteps 1-{args.grpo_steps - 1}: {total / (args.grpo_steps - 1):.2f} s a step timed")
    for phase, seconds in sorted(later.items(), key=lambda item: -item[1]):
        print(f"  {phase:<17} {100 * seconds / total:5.1f}%")


if __name__ == "__main__":
    main()
