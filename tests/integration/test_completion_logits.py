"""Log-probs of the completion without full-vocabulary logits over the prompt
(tunix_compat.completion_per_token_logps): the cost Tunix's own function pays, and equal
results (log-probs, entropy and gradients to float rounding, the fused projection summing in
another order), on a tiny Gemma 3 with LoRA; Tunix's GRPO loss with the entropy taken from
the log-probs' projection (tunix_compat.TokenEntropy) instead of a second one."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from schemas.recipe import LoraSpec
from stages.modeling import fast_paths, models, tunix_compat
from tests.conftest import recipe_with

VOCAB = 4096  # large enough that the output projection dominates, as Gemma 3's 262k does
PROMPT, COMPLETION, BATCH = 48, 16, 4


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any, Any]:
    root = str(tmp_path_factory.mktemp("logits"))
    recipe = recipe_with(root, model={"architecture": {"num_embed": VOCAB}})
    mesh = models.build_mesh(recipe.mesh)
    with mesh:
        network = models.apply_lora(
            models.build_base_model(recipe.model, mesh, root), LoraSpec(rank=4, alpha=8.0), mesh
        )
    adapters = nnx.state(network, nnx.LoRAParam)  # B starts at 0: move it so LoRA counts
    nnx.update(network, jax.tree.map(lambda x: x + 0.01, adapters))
    keys = jax.random.split(jax.random.key(0), 2)
    prompts = jax.random.randint(keys[0], (BATCH, PROMPT), 2, VOCAB).at[:, :7].set(0)  # left pad
    completions = jax.random.randint(keys[1], (BATCH, COMPLETION), 2, VOCAB).at[:, 11:].set(0)
    return network, prompts, completions, mesh


def logps(function: Any, network: Any, prompts: Any, completions: Any, **kw: Any) -> Any:
    graphdef, state = nnx.split(network)
    return function(graphdef, state, prompts, completions, pad_id=0, eos_id=1, **kw)


def flops(function: Any, network: Any, prompts: Any, completions: Any) -> float:
    graphdef, state = nnx.split(network)
    compiled = function.lower(graphdef, state, prompts, completions, pad_id=0, eos_id=1).compile()
    cost = compiled.cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def test_tunix_projects_the_prompt_to_the_vocabulary_too(policy: tuple[Any, ...]) -> None:
    """The defect, on Tunix alone: its compiled log-prob function costs about (prompt +
    completion) / completion times the projection it needs; FAR's costs the completion's."""
    network, prompts, completions, mesh = policy
    with mesh:
        tunix = flops(tunix_compat.TUNIX_COMPUTE_PER_TOKEN_LOGPS, network, prompts, completions)
        ours = flops(tunix_compat.completion_per_token_logps, network, prompts, completions)
    embed = network.embedder.input_embedding.value.shape[1]
    projection = 2 * BATCH * embed * VOCAB  # flops of one position's logits, per batch
    # Tunix pays the projection at all PROMPT + COMPLETION positions, FAR at COMPLETION
    assert tunix - ours == pytest.approx(projection * PROMPT, rel=0.05), (tunix, ours)


def test_log_probs_entropy_and_gradients_equal_tunixs(policy: tuple[Any, ...]) -> None:
    network, prompts, completions, mesh = policy
    temperature = 0.7  # the rollout temperature divides the logits on both paths
    with mesh:
        tunix, tunix_logits = logps(
            tunix_compat.TUNIX_COMPUTE_PER_TOKEN_LOGPS,
            network,
            prompts,
            completions,
            return_logits=True,
            temperature=temperature,
        )
        ours, our_entropy = logps(
            tunix_compat.completion_per_token_logps,
            network,
            prompts,
            completions,
            return_logits=True,
            temperature=temperature,
        )
        np.testing.assert_allclose(np.asarray(ours), np.asarray(tunix), rtol=1e-5, atol=1e-5)
        assert isinstance(our_entropy, tunix_compat.TokenEntropy)
        np.testing.assert_allclose(
            np.asarray(tunix_compat._entropy_from_logits(our_entropy)),
            np.asarray(tunix_compat.TUNIX_ENTROPY_FROM_LOGITS(tunix_logits)),
            rtol=1e-5,
            atol=1e-5,
        )
        graphdef, _ = nnx.split(network)
        _, adapters, frozen = nnx.split(network, nnx.LoRAParam, ...)

        def loss(function: Any) -> Any:
            """Gradient of a weighted sum of log-probs with respect to the adapters."""

            def of(trained: Any, rest: Any) -> Any:
                state = nnx.merge_state(trained, rest)
                out = function(
                    graphdef,
                    state,
                    prompts,
                    completions,
                    pad_id=0,
                    eos_id=1,
                    stop_gradient=False,
                    temperature=temperature,
                )
                return jnp.sum(out * jnp.arange(COMPLETION))

            return jax.jit(jax.grad(of))(adapters, frozen)  # one compilation, weights as arguments

        ours_grad = loss(tunix_compat.completion_per_token_logps)
        tunix_grad = loss(tunix_compat.TUNIX_COMPUTE_PER_TOKEN_LOGPS)
    for a, b in zip(jax.tree.leaves(ours_grad), jax.tree.leaves(tunix_grad), strict=True):
        scale = float(np.abs(np.asarray(b)).max())  # rounding is relative to the leaf's size
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-4 * scale)
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(ours_grad))


def grpo_loss(network: Any, prompts: Any, completions: Any) -> tuple[Any, Any]:
    """Tunix 0.1.7's GRPO loss (algo_core.grpo_loss_fn, through the log-prob and entropy
    functions its modules hold now): the compiled value-and-gradient with respect to the
    adapters, and its arguments."""
    from tunix.rl import algo_core
    from tunix.rl import common as rl_common
    from tunix.rl.grpo import grpo_learner

    graphdef, adapters, frozen = nnx.split(network, nnx.LoRAParam, ...)
    mask = (completions != 0).astype(jnp.int32)
    example = rl_common.TrainExample(
        prompt_ids=prompts,
        prompt_mask=(prompts != 0).astype(jnp.int32),
        completion_ids=completions,
        completion_mask=mask,
        advantages=jnp.array([1.0, -0.5, 0.25, -0.75]),
        ref_per_token_logps=None,
        old_per_token_logps=None,
    )
    config = grpo_learner.GRPOConfig(num_generations=2, beta=0.0)
    config.temperature = 0.7  # set by Tunix's learner from the rollout config

    def loss(trained: Any) -> Any:
        model = nnx.merge(graphdef, trained, frozen)
        return algo_core.grpo_loss_fn(model, example, config, pad_id=0, eos_id=1)

    return jax.jit(jax.value_and_grad(loss, has_aux=True)), adapters


def test_grpo_loss_takes_the_entropy_from_the_log_probs_projection(
    policy: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defect: Tunix's GRPO loss asks for the completion's full-vocabulary logits only to
    report their entropy, so FAR's completion-only log-probs had to decode them a second
    time. With the fast path "completion_logps" the loss, its entropy and its gradient are Tunix's
    own (to rounding), and the compiled step drops at least one completion projection."""
    from tunix.rl import common as rl_common

    from stages.modeling import tunix_api

    network, prompts, completions, mesh = policy

    def run() -> tuple[Any, Any, float]:
        step, adapters = grpo_loss(network, prompts, completions)
        (value, aux), grads = step(adapters)
        cost = step.lower(adapters).compile().cost_analysis()
        return (
            (value, aux["entropy"]),
            grads,
            float((cost[0] if isinstance(cost, list) else cost)["flops"]),
        )

    def decoded_logits(*args: Any, **kw: Any) -> Any:
        """FAR before: completion-only log-probs, and Tunix's own logits for the entropy."""
        out = tunix_compat.completion_per_token_logps(*args, **{**kw, "return_logits": False})
        if not kw.get("return_logits"):
            return out
        _, logits = tunix_compat.TUNIX_COMPUTE_PER_TOKEN_LOGPS(*args, **kw)
        return out, logits

    with mesh:
        monkeypatch.setattr(
            rl_common, "compute_per_token_logps", tunix_compat.TUNIX_COMPUTE_PER_TOKEN_LOGPS
        )
        monkeypatch.setattr(
            tunix_api.ENTROPY_MODULE,
            "compute_entropy_from_logits",
            tunix_compat.TUNIX_ENTROPY_FROM_LOGITS,
        )
        tunix_values, tunix_grads, _ = run()
        monkeypatch.setattr(rl_common, "compute_per_token_logps", decoded_logits)
        _, _, decoded_flops = run()
        with fast_paths.installed("completion_logps"):  # as the GRPO stage has it
            entropy = tunix_api.ENTROPY_MODULE.compute_entropy_from_logits
            assert entropy is tunix_compat._entropy_from_logits
            our_values, our_grads, our_flops = run()
    for ours, theirs in zip(our_values, tunix_values, strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-6)
    assert float(tunix_values[1]) > 1.0  # a real entropy over 4,096 tokens, not a stand-in 0
    for a, b in zip(jax.tree.leaves(our_grads), jax.tree.leaves(tunix_grads), strict=True):
        scale = float(np.abs(np.asarray(b)).max())
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-4 * scale)
    embed = network.embedder.input_embedding.value.shape[1]
    completion_projection = 2 * BATCH * COMPLETION * embed * VOCAB
    assert decoded_flops - our_flops >= completion_projection, (decoded_flops, our_flops)
