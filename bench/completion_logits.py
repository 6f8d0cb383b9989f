"""Tunix's log-probs against FAR's completion-only projection, on a recipe's real model.

GRPO computes the log-probability of every completion token several times a step: the actor
update (forward and backward) and, where used, the reference and old-policy passes. Tunix
0.1.7 projects every prompt and completion position to the vocabulary first;
tunix_compat.completion_per_token_logps projects the completion positions only. This builds
the recipe's base model with LoRA adapters (B moved off zero so they count), draws one batch
of prompt and completion tokens at the recipe's GRPO shapes, and prints, in one run, both
functions' compiled FLOPs, median seconds of the forward and of the gradient, their ratio,
and the largest difference of the log-probs and gradients (0 means bitwise equal).

    flock /tmp/far-heavy.lock env JAX_PLATFORMS=cpu .venv/bin/python -m bench.completion_logits \
        --recipe demo-reinforce --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any


def median_seconds(call: Callable[[], Any], repeats: int) -> float:
    """Median wall seconds of `call` after one warm-up (which compiles)."""
    import jax

    jax.block_until_ready(call())
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", default=os.environ.get("FAR_CACHE_DIR"))
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from schemas.recipe import LoraSpec
    from stages.core.runner import RunContext
    from stages.modeling import models, tunix_compat
    from tests.conftest import recipe_with

    with tempfile.TemporaryDirectory(prefix="far-logits-") as tmp:
        recipe = recipe_with(tmp, args.recipe)
        cache = RunContext(tmp, "bench", cache_dir=args.cache_dir).model_cache
        mesh = models.build_mesh(recipe.mesh)
        lora = recipe.sft.lora or LoraSpec(rank=8, alpha=16.0)
        with mesh:
            network = models.apply_lora(
                models.build_base_model(recipe.model, mesh, cache), lora, mesh
            )
    nnx.update(network, jax.tree.map(lambda x: x + 0.01, nnx.state(network, nnx.LoRAParam)))
    vocab = network.embedder.input_embedding.value.shape[0]
    rows = recipe.grpo.batch_size * recipe.grpo.num_generations
    prompt, completion = recipe.data.max_prompt_len, recipe.grpo.max_generation_tokens
    keys = jax.random.split(jax.random.key(0), 2)
    prompts = jax.random.randint(keys[0], (rows, prompt), 2, vocab).at[:, : prompt // 4].set(0)
    completions = jax.random.randint(keys[1], (rows, completion), 2, vocab)
    completions = completions.at[:, (3 * completion) // 4 :].set(0)
    graphdef, state = nnx.split(network)
    _, adapters, frozen = nnx.split(network, nnx.LoRAParam, ...)
    functions = {
        "tunix": tunix_compat.TUNIX_COMPUTE_PER_TOKEN_LOGPS,
        "far": tunix_compat.completion_per_token_logps,
    }

    def forward(function: Any) -> Any:
        return function(graphdef, state, prompts, completions, pad_id=0, eos_id=1)

    def gradient_of(function: Any) -> Any:
        """The compiled gradient of the summed log-probs with respect to the adapters."""

        def loss(trained: Any) -> Any:
            out = function(
                graphdef,
                nnx.merge_state(trained, frozen),
                prompts,
                completions,
                pad_id=0,
                eos_id=1,
                stop_gradient=False,
            )
            return jnp.sum(out)

        return jax.jit(jax.grad(loss))

    results: dict[str, dict[str, Any]] = {}
    with mesh:
        for name, function in functions.items():
            grad = gradient_of(function)
            compiled = function.lower(graphdef, state, prompts, completions, pad_id=0, eos_id=1)
            cost = compiled.compile().cost_analysis()
            results[name] = {
                "flops": float((cost[0] if isinstance(cost, list) else cost)["flops"]),
                "forward_s": median_seconds(lambda f=function: forward(f), args.repeats),
                "gradient_s": median_seconds(lambda g=grad: g(adapters), args.repeats),
                "logps": np.asarray(forward(function)),
                "grads": [np.asarray(g) for g in jax.tree.leaves(grad(adapters))],
            }
    tunix, far = results["tunix"], results["far"]
    print(
        f"\n{args.recipe}: {rows} rows of {prompt} prompt + {completion} completion tokens, "
        f"vocabulary {vocab} (load average {os.getloadavg()[0]:.1f})"
    )
    print(f"{'':12} {'tunix':>12} {'far':>12} {'far/tunix':>10}")
    for key in ("flops", "forward_s", "gradient_s"):
        print(f"{key:12} {tunix[key]:12.4g} {far[key]:12.4g} {far[key] / tunix[key]:10.3f}")
    logp_diff = float(np.abs(tunix["logps"] - far["logps"]).max())
    grad_diff = max(
        float(np.abs(a - b).max()) for a, b in zip(tunix["grads"], far["grads"], strict=True)
    )
    print(f"largest difference: log-probs {logp_diff:.3g}, adapter gradients {grad_diff:.3g}")


if __name__ == "__main__":
    main()
