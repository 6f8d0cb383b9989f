"""SFT's train step and each GRPO phase against the machine's measured roofline, in one run.

Runs data_prep, a short SFT and GRPO through FAR's stages (bench/grpo_phases.run_stages) and,
before SFT, before GRPO and after it, measures the machine's peaks: an f32 matmul at the
model's shapes ([tokens x embed] @ [embed x hidden], [tokens x embed] @ [embed x vocab]) for
FLOP/s and a large array update (x + 1: read and write) for bytes/s, so both see the same
contention. For each phase it counts the work the model must do from its architecture, and
prints and saves (JSON) the measured seconds, the achieved rate and the fraction of the bound
each phase reaches. `--baseline REF` runs the same measurement with the code of a git ref
(a temporary worktree), alternating with this tree (A B, B A, A B ...: neither always first),
and prints the ratios. `--grpo KEY=VALUE` sets a grpo field in this tree's measurements only:
a setting the baseline's code does not have (e.g. `draw=inverse_cdf` against code from before
it existed), so a ratio can be "this code as a recipe would run it" against "that code".

The count (2 FLOPs a multiply-add; L layers, d embed, f hidden, H heads of h dims, K kv heads,
V vocabulary, A LoRA parameters a layer, P prompt and C completion positions, R rows):

    linear params a layer   W = d*H*h (q) + 2*d*K*h (k, v) + H*h*d (out) + 3*d*f (MLP)
    forward, n positions    2*n*L*(W + A) + 4*n*c*L*H*h (attention over c positions)
                            + 2*p*d*V (the output projection at p positions)
    train (LoRA)            2*forward + attention + the adapters' gradients: the backward
                            computes activation gradients (one matmul per forward matmul),
                            never the frozen weights' (tests/unit/test_roofline.py checks
                            the gradient's compiled FLOPs against this)
    bytes                   the weights once per pass, 4*(L*W + V*d) in f32 (twice for a
                            train step); decode also reads its KV cache, 4*2*L*K*h*R*cache

    SFT step          train at R x S, projected at the T loss positions a row can hold
                      (`as run` before tunix_compat.target_positions_loss: every position)
    rollout prefill   forward at R x P, projected at the last prompt position only (Tunix
                      0.1.7's Gemma 3 projects every prompt position, `as run` before
                      fast path "prefill_last_position"; attention over the cache)
    rollout decode    per step a forward of R x 1 over the KV cache; steps = the longest
                      completion of the batch (Tunix's loop stops when every row ended)
    ref/old logps     forward at R x (P + C), projected at the C completion positions
    actor update      train at R x (P + C), projected at the C completion positions
    rewards           host work: no model FLOPs, no bound
    checkpoint save   bytes written: the adapters and Adam's two moments, 12 bytes a param

The bound is the larger of FLOPs / peak FLOP/s and bytes / peak bytes/s, on the shapes the
batch is padded to; `useful` is the fraction of those positions holding real tokens (the
padding's share is work the bound counts but the recipe does not need).

    JAX_PLATFORMS=cpu .venv/bin/python -m bench.roofline --recipe recipes/smoke.yaml
    JAX_PLATFORMS=cpu nice -n 19 .venv/bin/python -m bench.roofline --recipe recipes/demo.yaml \
        --sft-steps 6 --grpo-steps 3 --no-xla --baseline 491a66d^

On the real model XLA's cross-check (on by default) compiles two gradients of the 270M model
(minutes, ~13 GB resident beside the stages'): --no-xla skips it there; the unit test runs
it on the tiny model, and bench/completion_logits.py prints the real model's log-prob FLOPs.
A demo measurement needs ~6-9 GB free beside whatever else runs (491a66d^ is the commit
before the completion-only log-probs).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import grpo_phases
from bench.completion_logits import median_seconds

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
TREE = os.environ.get("FAR_BENCH_TREE")  # a baseline's worktree: its stages/, tests/

F32 = 4
COPY_BYTES = 256 * 2**20  # a quarter GiB: far beyond the caches
LINEARS = {  # Gemma's adapted linear layers: (inputs, outputs) from (d, f, H, h, K)
    "q_einsum": lambda d, f, H, h, K: (d, H * h),
    "kv_einsum": lambda d, f, H, h, K: (d, 2 * K * h),
    "attn_vec_einsum": lambda d, f, H, h, K: (H * h, d),
    "gate_proj": lambda d, f, H, h, K: (d, f),
    "up_proj": lambda d, f, H, h, K: (d, f),
    "down_proj": lambda d, f, H, h, K: (f, d),
}


# --- the model's work, counted from its architecture ------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arch:
    layers: int
    embed: int
    hidden: int
    heads: int
    head_dim: int
    kv_heads: int
    vocab: int
    lora_per_layer: int  # adapter parameters a layer (A: in x r, B: r x out)

    @classmethod
    def of(cls, config: Any, lora_rank: int | None, lora_modules: str) -> Arch:
        """From a Tunix ModelConfig and the recipe's LoRA (rank, module_path regex)."""
        d, f, H, h, K = (
            config.embed_dim,
            config.hidden_dim,
            config.num_heads,
            config.head_dim,
            config.num_kv_heads,
        )
        lora = 0
        if lora_rank:
            for name, shape in LINEARS.items():
                if re.fullmatch(lora_modules, f"layers.0.x.{name}"):
                    n_in, n_out = shape(d, f, H, h, K)
                    lora += lora_rank * (n_in + n_out)
        return cls(config.num_layers, d, f, H, h, K, config.num_embed, lora)

    @property
    def linear_per_layer(self) -> int:
        d, f, H, h, K = self.embed, self.hidden, self.heads, self.head_dim, self.kv_heads
        return d * H * h + 2 * d * K * h + H * h * d + 3 * d * f

    @property
    def params(self) -> int:
        return self.layers * self.linear_per_layer + self.vocab * self.embed

    @property
    def weight_bytes(self) -> int:
        return F32 * self.params

    def kv_bytes(self, rows: int, length: int) -> int:
        return F32 * 2 * self.layers * self.kv_heads * self.head_dim * rows * length

    def attention(self, rows: int, positions: int, context: int) -> float:
        return 4.0 * rows * positions * context * self.layers * self.heads * self.head_dim

    def forward(self, rows: int, positions: int, projected: int, context: int | None = None):
        """FLOPs of a forward pass; `projected` positions a row go through the output
        projection; attention over `context` positions (default all: dense, as computed)."""
        linear = (
            2.0 * rows * positions * self.layers * (self.linear_per_layer + self.lora_per_layer)
        )
        attention = self.attention(rows, positions, positions if context is None else context)
        return linear + attention + 2.0 * rows * projected * self.embed * self.vocab

    def train(self, rows: int, positions: int, projected: int) -> float:
        """Forward and backward with frozen base weights (LoRA)."""
        adapters = 2.0 * rows * positions * self.layers * self.lora_per_layer
        return (
            2 * self.forward(rows, positions, projected)
            + self.attention(rows, positions, positions)
            + adapters
        )


@dataclasses.dataclass(frozen=True)
class Shapes:
    sft_rows: int
    sft_len: int
    rows: int  # GRPO rows a step: prompts x generations
    prompt: int  # max_prompt_len: prompts are left-padded to it
    completion: int  # max_generation_tokens
    cache: int  # the sampler's KV cache length
    sft_targets: int = 0  # SFT's loss positions a row, at most (0: every position)

    @classmethod
    def of(cls, recipe: Any, dataset: Any, sft_targets: int = 0) -> Shapes:
        grpo = recipe.grpo
        prompt = dataset.prompt_len
        return cls(
            recipe.sft.batch_size,
            dataset.seq_len,
            grpo.batch_size * grpo.num_generations,
            prompt,
            grpo.max_generation_tokens,
            prompt + grpo.max_generation_tokens + 8,
            sft_targets,
        )


def phase_work(
    arch: Arch,
    shapes: Shapes,
    decode_steps: float,
    completion_only: bool,
    saves_per_step: float,
    prefill_last_only: bool = False,
    sft_targets_only: bool = False,
) -> dict[str, dict[str, float]]:
    """Per phase and per step: FLOPs and bytes needed, and FLOPs as the code runs them
    (`sft_targets_only`: SFT's loss projects its loss positions only, not every position)."""
    a, s = arch, shapes
    seq = s.prompt + s.completion
    prefill = a.forward(s.rows, s.prompt, 1, s.prompt)
    decode = decode_steps * a.forward(s.rows, 1, 1, s.cache)
    logps = a.forward(s.rows, seq, s.completion)
    logps_run = logps if completion_only else a.forward(s.rows, seq, seq)
    update = a.train(s.rows, seq, s.completion)
    update_run = update if completion_only else a.train(s.rows, seq, seq)
    sft = a.train(s.sft_rows, s.sft_len, s.sft_targets or s.sft_len)
    sft_run = sft if sft_targets_only else a.train(s.sft_rows, s.sft_len, s.sft_len)
    save = saves_per_step * 3 * F32 * a.layers * a.lora_per_layer
    return {
        "sft_step": {"flops": sft, "bytes": 2 * a.weight_bytes, "flops_run": sft_run},
        "rollout_prefill": {
            "flops": prefill,
            "bytes": a.weight_bytes + a.kv_bytes(s.rows, s.prompt),
            "flops_run": a.forward(s.rows, s.prompt, 1 if prefill_last_only else s.prompt, s.cache),
        },
        "rollout_decode": {
            "flops": decode,
            "bytes": decode_steps * (a.weight_bytes + a.kv_bytes(s.rows, s.cache)),
            "flops_run": decode,
        },
        "reference_logps": {"flops": logps, "bytes": a.weight_bytes, "flops_run": logps_run},
        "old_logps": {"flops": logps, "bytes": a.weight_bytes, "flops_run": logps_run},
        "actor_update": {"flops": update, "bytes": 2 * a.weight_bytes, "flops_run": update_run},
        "rewards": {"flops": 0.0, "bytes": 0.0, "flops_run": 0.0},
        "checkpoint_save": {"flops": 0.0, "bytes": save, "flops_run": 0.0},
    }


# --- the machine's peaks -----------------------------------------------------------------------


def measure_peaks(arch: Arch, tokens: int, projected: int, repeats: int = 5) -> dict[str, float]:
    """FLOP/s of f32 matmuls at the model's shapes and bytes/s of a large update (median)."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(0), 4)
    normal = lambda k, shape: jax.random.normal(k, shape, jnp.float32)  # noqa: E731
    matmul = jax.jit(jnp.matmul)
    update = jax.jit(lambda v: v + 1.0)
    cases: dict[str, tuple[Callable[[], Any], float]] = {}
    x, w = normal(keys[0], (tokens, arch.embed)), normal(keys[1], (arch.embed, arch.hidden))
    cases["matmul_hidden_flops"] = (lambda: matmul(x, w), 2.0 * tokens * arch.embed * arch.hidden)
    xp, e = normal(keys[2], (projected, arch.embed)), normal(keys[3], (arch.embed, arch.vocab))
    cases["matmul_vocab_flops"] = (lambda: matmul(xp, e), 2.0 * projected * arch.embed * arch.vocab)
    big = jnp.zeros(COPY_BYTES // F32, jnp.float32)
    cases["copy_bytes"] = (lambda: update(big), 2.0 * COPY_BYTES)
    return {name: work / median_seconds(call, repeats) for name, (call, work) in cases.items()}


# --- XLA's own count, as a cross-check -----------------------------------------------------------


def xla_flops(recipe: Any, shapes: Shapes, cache_dir: str) -> dict[str, float]:
    """Compiled FLOPs (XLA cost_analysis) of the log-prob function GRPO uses, forward and its
    gradient with respect to the adapters, at the recipe's GRPO shapes; and of SFT's loss
    gradient (next-token cross-entropy; at `shapes.sft_targets` loss positions a row where
    the tree's SFT projects only those, else at every position). On a LoRA clone."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from tunix.rl import common as rl_common

    from schemas.recipe import LoraSpec
    from stages.modeling import models, tunix_compat

    if hasattr(tunix_compat, "project_completion_only"):  # an older tree: process-wide
        tunix_compat.project_completion_only()
    else:  # for the script's life, as the GRPO stage has them
        from stages.modeling import fast_paths

        paths = fast_paths.installed("completion_logps", "lora_backward")
        contextlib.ExitStack().enter_context(paths)
    mesh = models.build_mesh(recipe.mesh)
    with mesh:
        network = models.apply_lora(
            models.build_base_model(recipe.model, mesh, cache_dir),
            recipe.sft.lora or LoraSpec(rank=8, alpha=16.0),
            mesh,
        )
    graphdef, state = nnx.split(network)
    _, adapters, frozen = nnx.split(network, nnx.LoRAParam, ...)
    logps = rl_common.compute_per_token_logps
    prompts = jnp.ones((shapes.rows, shapes.prompt), jnp.int32)
    completions = jnp.ones((shapes.rows, shapes.completion), jnp.int32)
    tokens = jnp.ones((shapes.sft_rows, shapes.sft_len), jnp.int32)

    def cost(fn: Any, *args: Any) -> float:
        analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
        return float((analysis[0] if isinstance(analysis, list) else analysis)["flops"])

    def forward(state: Any) -> Any:
        return logps(graphdef, state, prompts, completions, pad_id=0, eos_id=1)

    def grpo_loss(trained: Any) -> Any:
        out = logps(
            graphdef,
            nnx.merge_state(trained, frozen),
            prompts,
            completions,
            pad_id=0,
            eos_id=1,
            stop_gradient=False,
        )
        return jnp.sum(out)

    def sft_loss(trained: Any) -> Any:
        model = nnx.merge(graphdef, nnx.merge_state(trained, frozen))
        positions = jnp.broadcast_to(jnp.arange(shapes.sft_len), tokens.shape)
        mask = jnp.tril(jnp.ones((shapes.sft_len, shapes.sft_len), bool))[None]
        if hasattr(tunix_compat, "target_positions_loss"):  # as the SFT stage trains
            targets = shapes.sft_targets or shapes.sft_len - 1
            loss_mask = (jnp.arange(shapes.sft_len) >= shapes.sft_len - targets).astype(jnp.int32)
            loss_mask = jnp.broadcast_to(loss_mask, tokens.shape)
            return tunix_compat.target_positions_loss(targets)(
                model, tokens, loss_mask, positions, mask
            )
        logits, _ = model(tokens, positions, None, mask)
        return -jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(tokens, logits.shape[-1]))

    with mesh:
        return {
            "reference_logps": cost(forward, state),
            "actor_update": cost(jax.grad(grpo_loss), adapters),
            "sft_step": cost(jax.grad(sft_loss), adapters),
        }


# --- one measurement ----------------------------------------------------------------------------

STEADY_FROM = 2  # handouts 0-1 hold compilation and the first step's wait (Tunix reads a
#                  step's loss at the next step): SFT's steady step time starts after them


@contextlib.contextmanager
def sft_step_clock() -> Iterator[list[float]]:
    """When SFT handed out each batch, from the stage's own StepClock: the times the stage
    itself estimates step lengths from. The clock lives in the training tail's module, or in
    an older tree's sft module (a baseline measured with --baseline)."""
    try:
        from stages.modeling import training_tail as owner
    except ImportError:  # a tree from before the shared training tail
        from stages import sft as owner  # type: ignore[no-redef]

    handouts: list[float] = []
    original = owner.StepClock

    class Recording(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.times = handouts

    owner.StepClock = Recording
    try:
        yield handouts
    finally:
        owner.StepClock = original


def steady_step_seconds(handouts: list[float]) -> float:
    """The median time between batch handouts after the first STEADY_FROM (compilation).

    The stage's own tokens/s (its record) runs from the second handout to the end of
    training, so it also counts the first step's wait and the final checkpoint: on a short
    benchmark run that is a third of the time; here only steady steps count."""
    gaps = [b - a for a, b in itertools.pairwise(handouts)][STEADY_FROM:]
    if not gaps:
        raise ValueError(
            f"{len(handouts)} SFT batches timed: --sft-steps must be at least {STEADY_FROM + 2}"
        )
    return statistics.median(gaps)


def others_on_the_machine() -> list[str]:
    """The busiest processes outside this one's tree (the load this run shared the cores with)."""
    mine = {os.getpid(), os.getppid()}
    out = subprocess.run(
        ["ps", "-eo", "pid,ppid,pcpu,etimes,args", "--sort=-pcpu"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()[1:]
    busy = []
    for line in out:
        pid, ppid, pcpu, _, cmd = line.split(None, 4)
        if int(pid) in mine or int(ppid) in mine or float(pcpu) < 20:
            continue
        busy.append(f"{pcpu}% {cmd[:100]}")
    return busy[:4]


def measure(
    recipe_name: str,
    sft_steps: int,
    grpo_steps: int,
    cache_dir: str | None,
    xla: bool,
    grpo_changes: dict[str, Any] | None = None,
    xla_cache_dir: str | None = None,
) -> dict[str, Any]:
    """Peaks before SFT, before GRPO and after it; the stages' times; the counted work.
    `grpo_changes`: grpo fields set for this measurement (--grpo, this tree only);
    `xla_cache_dir`: JAX's persistent compilation cache (default: xla-bench in the cache)."""
    import jax

    import stages

    tree = TREE or str(REPO)
    code = str(Path(stages.__file__).resolve())
    if not code.startswith(str(Path(tree).resolve()) + os.sep):
        raise RuntimeError(f"this measurement would run {code}, not the code of {tree}")

    from stages.modeling import models, tunix_compat

    cache = cache_dir or str(Path.home() / ".cache" / "far")
    xla_cache = xla_cache_dir or str(Path(cache) / "xla-bench")
    jax.config.update("jax_compilation_cache_dir", xla_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    peaks: list[dict[str, float]] = []
    loads: list[float] = []
    state: dict[str, Any] = {}

    def between(stage: str, recipe: Any) -> None:
        if "arch" not in state:
            lora = recipe.sft.lora
            state["arch"] = Arch.of(
                models.tunix_config(recipe.model),
                lora and lora.rank,
                lora.module_path if lora else "",
            )
        rows = recipe.grpo.batch_size * recipe.grpo.num_generations
        seq = recipe.data.max_prompt_len + recipe.grpo.max_generation_tokens
        loads.append(os.getloadavg()[0])
        peaks.append(
            measure_peaks(state["arch"], rows * seq, rows * recipe.grpo.max_generation_tokens)
        )

    started = time.time()
    with sft_step_clock() as sft_handouts:
        run = grpo_phases.run_stages(
            recipe_name, sft_steps, grpo_steps, cache, between, grpo_changes=grpo_changes
        )
    recipe, dataset, arch = run["recipe"], run["dataset"], state["arch"]
    shapes = Shapes.of(recipe, dataset, run["sft_targets"])
    history, sft_metrics = run["grpo_history"], run["sft_metrics"]
    phases = grpo_phases.phase_seconds(history)
    later = {name: values[1:] for name, values in phases.items()}  # step 0 compiles
    steps = max(1, grpo_steps - 1)
    seconds = {name: sum(values) / steps for name, values in later.items()}
    seconds["sft_step"] = steady_step_seconds(sft_handouts)
    lengths = history.get("completions/max_length", [shapes.completion])[1:] or [shapes.completion]
    mean_lengths = history.get("completions/mean_length", [shapes.completion])[1:] or [
        shapes.completion
    ]
    decode_steps = min(statistics.mean(lengths), shapes.completion)
    saves = sum(1 for v in later.get("checkpoint_save", []) if v > 0) / steps
    completion_only = getattr(tunix_compat, "completion_per_token_logps", None) is not None
    last_only = hasattr(tunix_compat, "_gemma3_call")
    targets_only = hasattr(tunix_compat, "target_positions_loss")
    work = phase_work(arch, shapes, decode_steps, completion_only, saves, last_only, targets_only)
    prompt_real = statistics.mean(min(n, shapes.prompt) for n in run["prompt_lengths"])
    completion_real = statistics.mean(mean_lengths)
    useful = {
        "sft_step": sft_metrics["useful_token_fraction"],
        "rollout_prefill": prompt_real / shapes.prompt,
        "rollout_decode": completion_real / max(decode_steps, 1e-9),
        "reference_logps": (prompt_real + completion_real) / (shapes.prompt + shapes.completion),
    }
    useful["old_logps"] = useful["actor_update"] = useful["reference_logps"]
    skip_flat = getattr(recipe.grpo, "skip_flat_groups", False)  # older trees lack the field
    result = {
        "recipe": recipe_name,
        "grpo": recipe.grpo.model_dump(mode="json"),
        "tree": tree,
        "stages": code,
        "commit": subprocess.run(
            ["git", "-C", TREE or str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        "completion_only": completion_only,
        "prefill_last_position_only": last_only,
        "sft_targets_only": targets_only,
        "arch": dataclasses.asdict(arch),
        "shapes": dataclasses.asdict(shapes),
        "decode_steps": decode_steps,
        "peaks": peaks,
        "load_average": loads,
        "others": others_on_the_machine(),
        "seconds": seconds,
        "work": work,
        "useful": useful,
        # completions rolled out a second; with grpo.oversample the update trains on
        # 1/oversample of them (`grpo_trained_completions_per_s`)
        "grpo_completions_per_s": shapes.rows
        * getattr(recipe.grpo, "oversample", 1)
        / sum(v for k, v in seconds.items() if k != "sft_step"),
        "grpo_trained_completions_per_s": shapes.rows
        / sum(v for k, v in seconds.items() if k != "sft_step"),
        "grpo_steps": phases,  # every step's seconds a phase, step 0 (compiling) included
        # every step's other metrics: rewards, informative groups, completion lengths
        "grpo_metrics": {k: v for k, v in history.items() if grpo_phases.SECONDS_PREFIX not in k},
        **{  # of the step's groups, and of the groups the actor update runs over
            key: grpo_phases.arm_summary(history, recipe.grpo, skip_flat)[key]
            for key in ("informative_groups", "update_informative")
        },
        "xla_cache": xla_cache,
        "sft_tokens_per_s": shapes.sft_rows
        * sft_metrics["useful_token_fraction"]
        * shapes.sft_len
        / seconds["sft_step"],
        "sft_tokens_per_s_record": sft_metrics["tokens_per_second"],  # the stage's own figure
        "wall_s": time.time() - started,
    }
    if xla:
        result["xla_flops"] = xla_flops(recipe, shapes, cache)
    return result


# --- the table -------------------------------------------------------------------------------

ORDER = (
    "sft_step",
    "rollout_prefill",
    "rollout_decode",
    "rollout",
    "reference_logps",
    "old_logps",
    "actor_update",
    "rewards",
    "checkpoint_save",
)


def peak(runs: list[dict[str, Any]], name: str) -> float:
    return statistics.median(p[name] for run in runs for p in run["peaks"])


def table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row a phase: medians over `runs` of the seconds; the bound from the median peaks."""
    flops_peak = max(peak(runs, "matmul_hidden_flops"), peak(runs, "matmul_vocab_flops"))
    bytes_peak = peak(runs, "copy_bytes")
    rows = []
    for phase in ORDER:
        times = [run["seconds"][phase] for run in runs if phase in run["seconds"]]
        if not times:
            continue
        measured = statistics.median(times)
        work = runs[0]["work"].get(phase, {"flops": 0.0, "bytes": 0.0, "flops_run": 0.0})
        bound = max(work["flops"] / flops_peak, work["bytes"] / bytes_peak)
        rows.append(
            {
                "phase": phase,
                "seconds": measured,
                "seconds_min": min(times),
                "seconds_max": max(times),
                "gflop": work["flops"] / 1e9,
                "gflop_run": work["flops_run"] / 1e9,
                "gbyte": work["bytes"] / 1e9,
                "bound_s": bound,
                "fraction": bound / measured if measured > 0 and bound else None,
                "gflop_per_s": work["flops_run"] / measured / 1e9 if measured > 0 else 0.0,
                "bound_by": "-"
                if not bound
                else (
                    "compute"
                    if work["flops"] / flops_peak >= work["bytes"] / bytes_peak
                    else "memory"
                ),
                "useful": runs[0]["useful"].get(phase),
                "xla_gflop": runs[0].get("xla_flops", {}).get(phase, 0.0) / 1e9 or None,
            }
        )
    return rows


def steps_in(phases: dict[str, list[float]]) -> int:
    return max((len(v) for v in phases.values()), default=0)


def print_table(label: str, runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    loads = [load for run in runs for load in run["load_average"]]
    print(f"\n{label}: {len(runs)} run(s), load average {min(loads):.1f}-{max(loads):.1f}")
    for name in ("matmul_hidden_flops", "matmul_vocab_flops"):
        print(f"  peak {name}: {peak(runs, name) / 1e9:.1f} GFLOP/s")
    print(f"  peak copy: {peak(runs, 'copy_bytes') / 1e9:.2f} GB/s")
    for key in ("informative_groups", "update_informative"):
        shares = [f"{run[key]:.3f}" for run in runs if key in run]
        print(f"  {key} (steps 1-, each run): {', '.join(shares) or '-'}")
    for i, run in enumerate(runs):  # a step far above the others compiled a new shape
        steps = run.get("grpo_steps", {})
        totals = [sum(v[j] for v in steps.values() if j < len(v)) for j in range(steps_in(steps))]
        print(f"  run {i} GRPO seconds a step: {' '.join(f'{t:.1f}' for t in totals)}")
    head = (
        "phase",
        "s/step",
        "GFLOP",
        "as run",
        "XLA",
        "GB",
        "bound s",
        "by",
        "fraction",
        "GFLOP/s",
        "useful",
    )
    print("  " + " ".join(f"{h:>9}" if i else f"{h:<16}" for i, h in enumerate(head)))
    for r in rows:
        cells = [
            f"{r['seconds']:9.3f}",
            f"{r['gflop']:9.1f}",
            f"{r['gflop_run']:9.1f}",
            f"{r['xla_gflop']:9.1f}" if r["xla_gflop"] else f"{'':9}",
            f"{r['gbyte']:9.3f}",
            f"{r['bound_s']:9.3f}",
            f"{r['bound_by']:>9}",
            f"{r['fraction']:9.2f}" if r["fraction"] else f"{'-':>9}",
            f"{r['gflop_per_s']:9.1f}",
            f"{r['useful']:9.2f}" if r["useful"] is not None else f"{'':9}",
        ]
        print(f"  {r['phase']:<16} " + " ".join(cells))


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table as Markdown, for docs/performance.md."""
    lines = [
        "| phase | s/step (min-max) | GFLOP needed / as run | GB | bound (s) | bound by "
        "| fraction of bound | GFLOP/s | useful positions |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        spread = (
            f" ({r['seconds_min']:.3g}-{r['seconds_max']:.3g})"
            if r["seconds_max"] > r["seconds_min"]
            else ""
        )
        lines.append(
            f"| {r['phase']} | {r['seconds']:.3g}{spread} "
            f"| {r['gflop']:.3g} / {r['gflop_run']:.3g} "
            f"| {r['gbyte']:.3g} | {r['bound_s']:.3g} | {r['bound_by']} "
            f"| {'-' if r['fraction'] is None else format(r['fraction'], '.2f')} "
            f"| {r['gflop_per_s']:.3g} "
            f"| {'' if r['useful'] is None else format(r['useful'], '.2f')} |"
        )
    return "\n".join(lines)


def ratios(current: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, Any]:
    """Per repetition pair, current / baseline throughput: median (min-max)."""
    out = {}
    for key in ("grpo_completions_per_s", "grpo_trained_completions_per_s", "sft_tokens_per_s"):
        # results older than the trained count: every completion rolled out was trained on
        pairs = [
            c.get(key, c["grpo_completions_per_s"]) / b.get(key, b["grpo_completions_per_s"])
            for c, b in zip(current, baseline, strict=False)
        ]
        out[key] = {
            "median": statistics.median(pairs),
            "min": min(pairs),
            "max": max(pairs),
            "pairs": pairs,
        }
    return out


# --- the run ---------------------------------------------------------------------------------


def child(
    tree: str | None, args: argparse.Namespace, out: Path, xla: bool, scratch: str
) -> dict[str, Any]:
    """One measurement in a fresh process, with `tree`'s code (None: this one's); with
    --fresh-xla-cache its compilation cache is a new directory under `scratch`."""
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    env.pop("FAR_BENCH_TREE", None)
    env["PYTHONPATH"], cwd = str(REPO), REPO
    if tree:  # `-m` puts cwd first: this bench/ alone there, then the tree's stages/ and tests/
        env["FAR_BENCH_TREE"] = env["PYTHONPATH"] = tree
        cwd = Path(scratch) / "this-bench"
        if not cwd.exists():
            cwd.mkdir()
            (cwd / "bench").symlink_to(BENCH, target_is_directory=True)
    command = [
        sys.executable,
        "-m",
        "bench.roofline",
        "--recipe",
        args.recipe,
        "--sft-steps",
        str(args.sft_steps),
        "--grpo-steps",
        str(args.grpo_steps),
        "--child",
        str(out),
    ]
    if args.cache_dir:
        command += ["--cache-dir", args.cache_dir]
    if args.fresh_xla_cache:
        command += ["--xla-cache-dir", tempfile.mkdtemp(prefix="far-roofline-xla-", dir=scratch)]
    if not xla:
        command.append("--no-xla")
    if not tree:  # the baseline's code may not have these fields
        command += [f"--grpo={pair}" for pair in args.grpo]
    print(f"[{time.strftime('%H:%M:%S')}] measuring {tree or 'this tree'}", flush=True)
    subprocess.run(command, env=env, cwd=cwd, check=True)
    return json.loads(out.read_text())


def bad_argument(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, or None: checked before any compute."""
    if not (REPO / "recipes" / f"{args.recipe}.yaml").is_file():
        return f"--recipe {args.recipe}: no recipes/{args.recipe}.yaml"
    if args.sft_steps < STEADY_FROM + 2:
        return f"--sft-steps {args.sft_steps}: expected at least {STEADY_FROM + 2} (two steady)"
    if args.grpo_steps < 2:
        return f"--grpo-steps {args.grpo_steps}: expected at least 2 (step 0 compiles, untimed)"
    if args.reps < 1:
        return f"--reps {args.reps}: expected at least 1"
    from schemas.recipe import GRPOConfig

    for pair in args.grpo:
        key, sep, _ = pair.partition("=")
        if not sep or key not in GRPOConfig.model_fields:
            return f"--grpo {pair!r}: expected KEY=VALUE with KEY a grpo field"
    if args.baseline is not None:
        found = subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "rev-parse",
                "--verify",
                "--quiet",
                f"{args.baseline}^{{commit}}",
            ],
            capture_output=True,
            check=False,
        )
        if found.returncode != 0:
            return f"--baseline {args.baseline!r}: not a commit of {REPO} (expected a git ref)"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument(
        "--sft-steps", type=int, default=5, help="SFT steps (the first two, compiling, untimed)"
    )
    parser.add_argument("--grpo-steps", type=int, default=4)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument(
        "--baseline", help="a git ref: its code measured alternately with this tree"
    )
    parser.add_argument(
        "--no-xla",
        action="store_true",
        help="skip XLA's FLOP count cross-check (slow on a real model)",
    )
    parser.add_argument(
        "--grpo",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a grpo field for this tree's measurements only (VALUE read as YAML; repeatable): "
        "a setting the baseline's code lacks, e.g. draw=inverse_cdf",
    )
    parser.add_argument("--cache-dir", default=os.environ.get("FAR_CACHE_DIR"))
    parser.add_argument(
        "--fresh-xla-cache",
        action="store_true",
        help="give every measurement an empty compilation cache, so each pays all of its "
        "compiles (default: one cache under the cache dir, shared by all measurements: a "
        "shape another measurement compiled with the same code is loaded, not compiled)",
    )
    parser.add_argument("--xla-cache-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help="the JSON (default bench/results/roofline-<recipe>.json)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.recipe = Path(args.recipe).stem  # recipes/demo.yaml or demo
    problem = bad_argument(args)
    if problem:  # before any compute: one line, exit 2
        print(f"roofline: {problem}", file=sys.stderr)
        raise SystemExit(2)
    changes = grpo_phases.parse_changes(args.grpo)
    if args.child:
        result = measure(
            args.recipe,
            args.sft_steps,
            args.grpo_steps,
            args.cache_dir,
            not args.no_xla,
            changes,
            args.xla_cache_dir,
        )
        result["grpo_changes"] = changes  # this tree's --grpo (the baseline runs the recipe)
        Path(args.child).write_text(json.dumps(result))
        return

    recipe_label = args.recipe
    out = Path(args.out or BENCH / "results" / f"roofline-{recipe_label}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f"{out.stem}.runs"  # each measurement as it ends (a crash keeps them)
    partial.mkdir(exist_ok=True)
    current: list[dict[str, Any]] = []
    baseline: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="far-roofline-") as tmp:
        base_tree = None
        if args.baseline:
            base_tree = str(Path(tmp) / "baseline")
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "--detach", base_tree, args.baseline],
                check=True,
                capture_output=True,
            )
        try:
            for rep in range(args.reps):
                xla = not args.no_xla and rep == 0
                if base_tree and rep % 2:  # ABBA: neither tree always runs first
                    baseline.append(
                        child(base_tree, args, partial / f"baseline-{rep}.json", False, tmp)
                    )
                current.append(child(None, args, partial / f"current-{rep}.json", xla, tmp))
                if base_tree and not rep % 2:
                    baseline.append(
                        child(base_tree, args, partial / f"baseline-{rep}.json", False, tmp)
                    )
        finally:
            if base_tree:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", base_tree],
                    check=False,
                )
    report: dict[str, Any] = {
        "recipe": args.recipe,
        "argv": sys.argv[1:],
        "current": current,
        "table": table(current),
    }
    print_table(f"{recipe_label} at {current[0]['commit']}", current, report["table"])
    if baseline:
        report["baseline"], report["baseline_table"] = baseline, table(baseline)
        report["ratios"] = ratios(current, baseline)
        print_table(
            f"{recipe_label} baseline {args.baseline} ({baseline[0]['commit']})",
            baseline,
            report["baseline_table"],
        )
        for key, value in report["ratios"].items():
            print(
                f"  {key}: current / baseline {value['median']:.3f} "
                f"({value['min']:.3f}-{value['max']:.3f}) over {len(value['pairs'])} pair(s)"
            )
    print("\n" + markdown(report["table"]) + "\n")
    print("  others on the machine:", current[-1]["others"] or "none above 20% CPU")
    out.write_text(json.dumps(report, indent=1, default=str))
    shutil.rmtree(partial)
    print(f"  saved {out}")


if __name__ == "__main__":
    main()
