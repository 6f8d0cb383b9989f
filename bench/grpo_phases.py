"""Where a GRPO step's time goes, phase by phase (stages/grpo/timing.py), on a recipe's model.

Runs data_prep, a short SFT and GRPO through FAR's stages and prints, from the GRPO record's
history, each step's seconds per phase and each phase's share of the timed time over the
steps after the first (the first one compiles). bench/roofline.py runs the same stages
(`run_stages`) and sets each phase's time against the machine's bound.

    JAX_PLATFORMS=cpu .venv/bin/python bench/grpo_phases.py                       # smoke
    flock /tmp/far-heavy.lock env JAX_PLATFORMS=cpu .venv/bin/python bench/grpo_phases.py \
        --recipe demo --sft-steps 2 --grpo-steps 4                     # the real Gemma 3 270M
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# tests.conftest.recipe_with: a recipe with fields replaced. Appended, not put first: when
# bench/roofline.py measures a baseline tree it has put that tree first, and this module must
# not put the current tree's stages ahead of it (it did: the --baseline run measured this code).
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

SECONDS_PREFIX = "far/seconds/"  # stages/grpo/timing.PREFIX (kept here: older trees import it)


def run_stages(
    recipe_name: str,
    sft_steps: int,
    grpo_steps: int,
    cache_dir: str | None,
    between: Callable[[str, Any], None] | None = None,
) -> dict[str, Any]:
    """data_prep, SFT and GRPO of `recipe_name` through FAR's stages in a temporary root.

    `between(stage, recipe)` runs before "sft", before "grpo" and after it ("end"), outside
    any stage's clock. Returns the recipe, the dataset artifact, the SFT record's metrics, the
    GRPO record's history, the real prompt lengths of the GRPO split in tokens, and the most
    SFT loss targets a row holds."""
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
            tmp, recipe_name, sft={"max_steps": sft_steps}, grpo={"max_steps": grpo_steps}
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
        out = grpo.reinforce(dataset, sft_out.output, recipe.grpo, recipe.model, recipe.mesh, ctx)
        history = StageRecord.model_validate(storage.read_json(out.record_uri)).history
        mark("end")
    return {
        "recipe": recipe,
        "dataset": dataset,
        "sft_metrics": dict(sft_record.metrics),
        "grpo_history": history,
        "prompt_lengths": prompt_lengths,
        "sft_targets": int(loss_mask.sum(axis=1).max()),
    }


def phase_seconds(history: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each timed GRPO phase's seconds per step, from the record's history."""
    return {k.removeprefix(SECONDS_PREFIX): v for k, v in history.items() if SECONDS_PREFIX in k}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument("--sft-steps", type=int, default=4)
    parser.add_argument("--grpo-steps", type=int, default=6)
    parser.add_argument("--cache-dir", default=os.environ.get("FAR_CACHE_DIR"))
    args = parser.parse_args()

    run = run_stages(args.recipe, args.sft_steps, args.grpo_steps, args.cache_dir)
    phases = phase_seconds(run["grpo_history"])
    print(f"\n{args.recipe}: GRPO seconds per step and phase (load average {os.getloadavg()})")
    print("phase             " + " ".join(f"step {i:>3}" for i in range(args.grpo_steps)))
    for phase, values in phases.items():
        print(f"{phase:<17} " + " ".join(f"{v:8.3f}" for v in values))
    later = {phase: sum(values[1:]) for phase, values in phases.items()}
    total = sum(later.values())
    print(f"\nsteps 1-{args.grpo_steps - 1}: {total / (args.grpo_steps - 1):.2f} s a step timed")
    for phase, seconds in sorted(later.items(), key=lambda item: -item[1]):
        print(f"  {phase:<17} {100 * seconds / total:5.1f}%")


if __name__ == "__main__":
    main()
