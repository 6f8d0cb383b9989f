"""One of two CPU processes joined by jax.distributed (gloo collectives), running FAR stages
on the tiny model with a mesh across both processes' devices.

usage: python -m tests.integration._multihost_child PORT PROCESS_ID ROOT STAGE [MAX_STEPS]
STAGE: sft (data_prep then SFT to MAX_STEPS; a stop is requested in process 1 only after
step 3 when MAX_STEPS is negative, |MAX_STEPS| being the target); continue (then GRPO and
evaluation of sft and grpo).
Prints one JSON line: the outcome, or the error it ended with.
"""

from __future__ import annotations

import json
import sys
import traceback

import jax

from stages.core.sessions import StopFlag


def main(port: int, process_id: int, root: str, stage: str, max_steps: int) -> int:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
    from stages import sft
    from stages.core.runner import RunContext, SessionExpired, is_primary_process
    from stages.data_prep import build as data_prep
    from stages.evaluate import evaluation as evaluate
    from stages.grpo import training as grpo
    from tests.conftest import recipe_with, use_session_compile_cache

    use_session_compile_cache()  # the resumed session loads what the stopped one compiled

    steps = abs(max_steps)
    recipe = recipe_with(
        root,
        mesh={"fsdp": 2},
        sft={"max_steps": steps, "checkpoint_every_steps": 3, "save_margin_seconds": 0.0},
        grpo={"max_steps": 2, "max_generation_tokens": 8},
        eval={"models": ["sft", "grpo"], "max_generation_tokens": 8},
    )
    stop = StopAfterSteps(3) if max_steps < 0 and process_id == 1 else StopFlag()
    ctx = RunContext(root, "multihost", primary=is_primary_process(), stop=stop)
    report: dict[str, object] = {"process": process_id, "devices": jax.device_count()}
    try:
        dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
        policy = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx)
        report.update(sft_step=policy.output.step, sft_record=policy.record_uri)
        if stage == "continue":  # then GRPO and evaluation, across both processes
            reinforced = grpo.reinforce(
                dataset, policy.output, recipe.grpo, recipe.model, recipe.mesh, ctx
            )
            report.update(grpo_step=reinforced.output.step, grpo_record=reinforced.record_uri)
            checkpoints = {"sft": policy.output, "grpo": reinforced.output}
            evaluated = evaluate.evaluate(
                dataset, checkpoints, recipe.eval, recipe.model, recipe.mesh, ctx
            )
            report["scores"] = [s.model_dump(mode="json") for s in evaluated.output.scores]
            report["eval_record"] = evaluated.record_uri
        report["outcome"] = "complete"
    except SessionExpired as e:
        report.update(outcome="stopped", detail=str(e))
    except Exception as e:
        report.update(outcome="error", error=f"{type(e).__name__}: {e}")
        traceback.print_exc()
    print(json.dumps(report), flush=True)
    return 0


class StopAfterSteps(StopFlag):
    """A stop request arriving in this process only, after `after` training steps began: the
    SIGTERM one host of a slice gets first."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after, self.checks = after, 0

    def is_set(self) -> bool:
        self.checks += 1
        if self.checks > self.after + 1:  # +1: the stage-start check in run_stage
            self.request("SIGTERM (one process)")
        return super().is_set()


if __name__ == "__main__":
    port, pid, root, stage = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    sys.exit(main(port, pid, root, stage, int(sys.argv[5]) if len(sys.argv) > 5 else 6))
