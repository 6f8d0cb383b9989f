"""The fast path "prefill_last_position" (tunix_compat._gemma3_call): Tunix's Sampler projects
every prompt position of a Gemma 3 prefill to the vocabulary and keeps one; with the fast
path, only the last position is projected and the sampled completions are the same, bit for bit."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from tunix.models.gemma3 import model as gemma3_model

from stages.modeling import fast_paths, generation, models, tunix_compat
from stages.modeling.tokenizers import build_tokenizer
from tests.conftest import recipe_with

PROMPTS = [f"What is {a} + {b}?" for a, b in ((1, 2), (13, 29), (7, 7), (40, 2), (5, 61))]


@pytest.fixture
def tunix_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tunix's own Gemma3.__call__ for this test, restored after it (the compat is global)."""
    monkeypatch.setattr(gemma3_model.Gemma3, "__call__", tunix_compat.TUNIX_GEMMA3_CALL)


def base_and_tokenizer(root: Path) -> tuple[Any, Any, Any]:
    recipe = recipe_with(str(root), "smoke")
    base = models.build_base_model(recipe.model, models.build_mesh(recipe.mesh), str(root))
    return recipe, base, build_tokenizer(recipe.model, str(root))


def lora_clone(recipe: Any, base: Any) -> Any:
    """A LoRA clone of `base` (qwix binds the model's __call__ as it is when cloning), its
    B moved off zero so the adapters change the logits; the same adapters every time."""
    network = models.apply_lora(base, recipe.sft.lora, models.build_mesh(recipe.mesh))
    nnx.update(network, jax.tree.map(lambda x: x + 0.05, nnx.state(network, nnx.LoRAParam)))
    return network


def sample(recipe: Any, network: Any, tokenizer: Any) -> tuple[Any, list[str]]:
    sampler = generation.build_sampler(network, tokenizer, recipe.model, 32, 16)
    texts = generation.generate(
        sampler,
        tokenizer,
        PROMPTS,
        prompt_len=32,
        max_tokens=16,
        batch_size=4,
        temperature=0.9,
        seed=3,
    )
    return sampler, texts


def prefill_flops(network: Any, last_only: bool) -> float:
    """Compiled FLOPs of the model's call as the Sampler's prefill makes it (4 x 32 tokens)."""
    graphdef, state = nnx.split(network)
    tokens = jnp.ones((4, 32), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(32), tokens.shape)
    mask = jnp.tril(jnp.ones((32, 32), bool))[None]
    kwargs = {"decode_only_last_token": True} if last_only else {}

    def call(state: Any) -> Any:
        return nnx.merge(graphdef, state)(tokens, positions, None, mask, **kwargs)[0]

    cost = jax.jit(call).lower(state).compile().cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def test_tunix_alone_projects_every_prompt_position(tmp_path: Path, tunix_call: None) -> None:
    recipe, base, tokenizer = base_and_tokenizer(tmp_path)
    network = lora_clone(recipe, base)
    sampler, _ = sample(recipe, network, tokenizer)
    assert not sampler._supports_decode_only_last_token  # so its prefill asks for every position
    with pytest.raises(TypeError):
        network(jnp.ones((1, 4), jnp.int32), decode_only_last_token=True)


def test_last_position_only_samples_the_same_completions(tmp_path: Path, tunix_call: None) -> None:
    recipe, base, tokenizer = base_and_tokenizer(tmp_path)
    _, tunix_texts = sample(recipe, lora_clone(recipe, base), tokenizer)
    tunix_flops = prefill_flops(lora_clone(recipe, base), last_only=False)

    with fast_paths.installed("prefill_last_position"):  # before the clone, as in a stage
        network = lora_clone(recipe, base)
        far_sampler, far_texts = sample(recipe, network, tokenizer)
    assert far_sampler._supports_decode_only_last_token
    assert far_texts == tunix_texts
    # the projection at 31 of 32 positions is gone: 4 x 31 x 128 x 512 multiply-adds
    arch = models.tunix_config(recipe.model)
    saved = 2 * 4 * 31 * arch.embed_dim * arch.num_embed
    assert tunix_flops - prefill_flops(network, last_only=True) >= 0.95 * saved
    # the last position's logits themselves are equal, bit for bit, compiled as the Sampler
    # compiles its prefill (op by op, outside jit, they differ in the last bits)
    graphdef, state = nnx.split(network)
    tokens = jnp.arange(4 * 32, dtype=jnp.int32).reshape(4, 32) % 500 + 2
    positions = jnp.broadcast_to(jnp.arange(32), tokens.shape)
    mask = jnp.tril(jnp.ones((32, 32), bool))[None]

    @functools.partial(jax.jit, static_argnums=1)
    def logits(state: Any, last_only: bool) -> Any:
        model = nnx.merge(graphdef, state)
        return model(tokens, positions, None, mask, decode_only_last_token=last_only)[0]

    last = logits(state, True)
    assert last.shape == (4, 1, arch.num_embed)
    assert bool((logits(state, False)[:, -1:] == last).all())
