"""bench/roofline.py's count of the model's work, against Gemma 3 270M's known size and against
XLA's own count of the compiled functions on the tiny model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import roofline
from schemas.recipe import GRPOConfig
from stages.modeling import models
from tests.conftest import recipe_with

REPO = Path(__file__).resolve().parents[2]


def arch_of(recipe: Any) -> Any:
    lora = recipe.sft.lora
    return roofline.Arch.of(models.tunix_config(recipe.model), lora.rank, lora.module_path)


def shapes_of(recipe: Any) -> Any:
    grpo, data = recipe.grpo, recipe.data
    return roofline.Shapes(
        recipe.sft.batch_size,
        data.max_seq_len,
        grpo.batch_size * grpo.num_generations,
        data.max_prompt_len,
        grpo.max_generation_tokens,
        data.max_prompt_len + grpo.max_generation_tokens + 8,
        data.max_seq_len // 3,  # SFT loss positions a row: a completion after its prompt
    )


def test_gemma3_270m_counts(tmp_path: Path) -> None:
    """The issue's rough count: ~268M parameters, ~0.54 GFLOP a token forward, 0.34 of it
    the 262,144 x 640 output projection; 1.07 GB of f32 weights read per pass."""
    arch = arch_of(recipe_with(str(tmp_path), "demo"))
    assert arch.vocab == 262_144 and arch.embed == 640 and arch.layers == 18
    assert 0.26e9 < arch.params < 0.28e9
    assert arch.weight_bytes == pytest.approx(1.07e9, rel=0.01)
    token = arch.forward(1, 1, 1, context=0)
    assert token == pytest.approx(0.54e9, rel=0.02)
    assert 2 * arch.embed * arch.vocab / token == pytest.approx(0.62, abs=0.01)
    # adapters on every linear layer, rank 8: under 1% of a token's work
    assert 0 < arch.lora_per_layer * arch.layers < 0.01 * arch.params


def test_completion_only_projection_is_counted(tmp_path: Path) -> None:
    recipe = recipe_with(str(tmp_path), "demo")
    arch, shapes = arch_of(recipe), shapes_of(recipe)
    new = roofline.phase_work(arch, shapes, 32, completion_only=True, saves_per_step=0)
    old = roofline.phase_work(arch, shapes, 32, completion_only=False, saves_per_step=0)
    assert new["actor_update"]["flops_run"] == new["actor_update"]["flops"]
    assert old["actor_update"]["flops_run"] > 1.5 * new["actor_update"]["flops"]
    # prefill needs the last prompt position's logits only; Tunix projects every one
    prefill = new["rollout_prefill"]
    assert prefill["flops_run"] > 2 * prefill["flops"]
    last = roofline.phase_work(arch, shapes, 32, True, 0, prefill_last_only=True)
    assert last["rollout_prefill"]["flops_run"] < 1.1 * prefill["flops"]  # attention: the cache
    # SFT's loss needs logits at its loss positions only; Tunix's loss projects every one
    sft = roofline.phase_work(arch, shapes, 32, True, 0, sft_targets_only=True)["sft_step"]
    assert new["sft_step"]["flops_run"] > 1.5 * sft["flops"] == 1.5 * sft["flops_run"]


def test_counts_match_xla_on_the_tiny_model(tmp_path: Path) -> None:
    """The analytic count of each compiled model function is within 5% of XLA's
    cost_analysis (which also counts the elementwise work the count leaves out)."""
    recipe = recipe_with(str(tmp_path), "smoke")
    arch, shapes = arch_of(recipe), shapes_of(recipe)
    work = roofline.phase_work(
        arch, shapes, 24, completion_only=True, saves_per_step=0, sft_targets_only=True
    )
    compiled = roofline.xla_flops(recipe, shapes, str(tmp_path / "cache"))
    for phase in ("reference_logps", "actor_update", "sft_step"):
        assert work[phase]["flops_run"] == pytest.approx(compiled[phase], rel=0.05), phase


def test_lora_gradient_skips_the_frozen_weights(tmp_path: Path) -> None:
    """jax.grad with respect to the adapters alone compiles no gradient of the frozen
    weights: its FLOPs are the count's 2x forward (activation gradients), well below the
    gradient with respect to every parameter (about 3x forward)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    recipe = recipe_with(str(tmp_path), "smoke")
    mesh = models.build_mesh(recipe.mesh)
    base = models.build_base_model(recipe.model, mesh, str(tmp_path))
    network = models.apply_lora(base, recipe.sft.lora, mesh)
    graphdef, adapters, frozen = nnx.split(network, nnx.LoRAParam, ...)
    _, params, rest = nnx.split(network, nnx.Param, ...)
    tokens = jnp.ones((8, 64), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(64), tokens.shape)
    mask = jnp.tril(jnp.ones((64, 64), bool))[None]

    def loss(trained: Any, other: Any) -> Any:
        logits, _ = nnx.merge(graphdef, trained, other)(tokens, positions, None, mask)
        return jnp.sum(jax.nn.log_softmax(logits)[..., 0])

    def flops(fn: Any, *args: Any) -> float:
        cost = jax.jit(fn).lower(*args).compile().cost_analysis()
        return float((cost[0] if isinstance(cost, list) else cost)["flops"])

    forward = flops(loss, adapters, frozen)
    lora_grad = flops(jax.grad(loss), adapters, frozen)
    full_grad = flops(jax.grad(loss), params, rest)
    assert lora_grad < 2.3 * forward < full_grad
    assert full_grad > 1.25 * lora_grad


def test_sft_steps_are_timed_after_compilation_by_their_median() -> None:
    # handouts: compile + step 0, the first step's wait, then steady steps of ~2 s
    handouts = [0.0, 9.0, 15.0, 17.0, 19.5, 21.5]
    assert roofline.steady_step_seconds(handouts) == 2.0
    with pytest.raises(ValueError, match="at least 4"):
        roofline.steady_step_seconds([0.0, 9.0, 15.0])


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--grpo-steps", "1"], "--grpo-steps 1"),
        (["--baseline", "no-such-ref-37"], "--baseline 'no-such-ref-37'"),
        (["--baseline", ""], "--baseline ''"),
        (["--reps", "0"], "--reps 0"),
        (["--recipe", "no_such_recipe"], "--recipe no_such_recipe"),
        (["--grpo", "no_such_field=1"], "--grpo 'no_such_field=1'"),
        (["--grpo", "draw"], "--grpo 'draw'"),
    ],
)
def test_bad_arguments_are_one_line_exit_2_before_compute(argv: list[str], named: str) -> None:
    """Was: a traceback after data_prep and SFT (or a git error). The out path is a fresh
    directory, which stays absent: nothing ran."""
    out = REPO / "test-outputs" / "roofline-refused" / "out.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.roofline", *argv, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"roofline: {named}:"), done.stderr
    assert not out.parent.exists()


@pytest.mark.parametrize("call", ["0", "5"])
def test_grpo_trace_refuses_an_update_it_will_not_reach(call: str) -> None:
    """bench/grpo_trace.py: a --call outside 1..--grpo-steps would run the stages and trace
    nothing; it is one line, exit 2, before any compute."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.grpo_trace", "--grpo-steps", "4", "--call", call],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"grpo_trace: --call {call}: expected 1 to 4 (--grpo-steps)\n"


def test_an_oversampled_arm_counts_rolled_out_and_trained_completions() -> None:
    """grpo.oversample 2: a step rolls out twice the groups it trains on, and the update's
    informative share starts from the kept groups' share the stage logs (then
    skip_flat_groups' power-of-two fill); step 0 (compiling) is left out."""
    grpo = GRPOConfig(
        max_steps=3, batch_size=4, num_generations=8, beta=0.0, oversample=2, skip_flat_groups=True
    )
    history = {
        "far/seconds/rollout_decode": [9.0, 2.0, 2.0],
        "far/seconds/actor_update": [9.0, 2.0, 2.0],
        "far/informative_groups": [0.5, 0.25, 0.375],
        "far/update_informative_groups": [1.0, 0.5, 0.75],
    }
    summary = roofline.grpo_phases.arm_summary(history, grpo, skip_flat=True)
    assert summary["completions_per_s"] == 2 * 4 * 8 / 4.0
    assert summary["trained_completions_per_s"] == 4 * 8 / 4.0
    assert summary["informative_groups"] == (0.25 + 0.375) / 2
    # kept 2 informative of 4: skip_flat trains those 2 (1.0); 3 of 4: a flat one fills (0.75)
    assert summary["update_informative"] == (1.0 + 0.75) / 2
