"""grpo.sampler_projection: the rollout's vocabulary projection through a bfloat16 copy of
Gemma 3's tied embedding (tunix_compat.attach_vocab_table). The sampler's logits are the
bfloat16-operand product, the actor's log-probs still read the float32 table, nothing
trainable or saved sees the copy, and a table that could go stale is refused."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stages.modeling import fast_paths, generation, projection, tunix_compat
from tests.unit.test_prefill_last_position import base_and_tokenizer, lora_clone

PROMPTS = ["What is 3 + 4?", "What is 12 * 7?"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    """(recipe, base network, tokenizer): one tiny model for the module's tests."""
    return base_and_tokenizer(tmp_path_factory.mktemp("vocab-table"))


def greedy_logits(network: object, tokenizer: object, recipe: object) -> np.ndarray:
    sampler = generation.build_sampler(network, tokenizer, recipe.model, 16, 8)  # type: ignore[attr-defined]
    out = sampler(
        input_strings=PROMPTS,
        max_generation_steps=8,
        max_prompt_length=16,
        echo=False,
        return_logits=True,
    )
    return np.stack([np.asarray(x) for x in out.logits])


@pytest.fixture
def vocab_path() -> Any:
    """FAR's embedder decode installed in Tunix's Gemma 3 for the test, as GRPO has it."""
    with fast_paths.installed("vocab_table"):
        yield


def test_the_bfloat16_table_is_refused_outside_the_fast_path(built: tuple[Any, Any, Any]) -> None:
    recipe, base, _ = built
    network = lora_clone(recipe, base)
    with pytest.raises(RuntimeError, match=r"fast_paths.installed\('vocab_table'\)"):
        tunix_compat.attach_vocab_table(network, "bfloat16")
    assert getattr(network.embedder, "vocab_table", None) is None


def test_the_sampler_projects_through_the_bfloat16_table(
    built: tuple[Any, Any, Any], vocab_path: None
) -> None:
    recipe, base, tokenizer = built
    network = lora_clone(recipe, base)
    embedding = network.embedder.input_embedding.value
    hidden = jax.random.normal(jax.random.key(0), (3, 1, embedding.shape[1]))
    before = network.embedder.decode(hidden)
    f32_logits = greedy_logits(network, tokenizer, recipe)
    params = jax.tree.map(np.asarray, nnx.state(network, nnx.Param))

    tunix_compat.attach_vocab_table(network, "bfloat16")

    table = network.embedder.vocab_table.value
    assert table.dtype == jnp.bfloat16 and table.shape == embedding.shape[::-1]
    expected = jnp.dot(
        hidden.astype(jnp.bfloat16),
        embedding.T.astype(jnp.bfloat16),
        preferred_element_type=jnp.float32,
    )
    after = network.embedder.decode(hidden)
    assert after.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(after), np.asarray(expected))
    assert not np.array_equal(np.asarray(after), np.asarray(before))  # other logits
    np.testing.assert_allclose(np.asarray(after), np.asarray(before), atol=0.05)
    # the sampler built now decodes through the copy: close to, not equal to, float32
    bf16_logits = greedy_logits(network, tokenizer, recipe)
    assert bf16_logits.shape == f32_logits.shape
    assert not np.array_equal(bf16_logits, f32_logits)
    np.testing.assert_allclose(bf16_logits, f32_logits, atol=0.1)
    # no parameter moved or appeared (optimizer, checkpoint and export read these)
    after_params = jax.tree.map(np.asarray, nnx.state(network, nnx.Param))
    assert jax.tree.structure(after_params) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, after_params, params)
    # the actor's log-probs read the float32 table, as before
    targets = jnp.array([[1, 2, 3]])
    np.testing.assert_array_equal(
        np.asarray(projection.token_logps(hidden.reshape(1, 3, -1), embedding, targets)),
        np.asarray(
            projection.token_logps(
                hidden.reshape(1, 3, -1), network.embedder.input_embedding.value, targets
            )
        ),
    )


def test_float32_leaves_the_model_as_it_is(built: tuple[Any, Any, Any]) -> None:
    recipe, base, _ = built
    network = lora_clone(recipe, base)
    tunix_compat.attach_vocab_table(network, "float32")
    assert getattr(network.embedder, "vocab_table", None) is None


def test_a_table_that_could_go_stale_is_refused(built: tuple[Any, Any, Any]) -> None:
    recipe, base, _ = built
    with pytest.raises(ValueError, match="needs a LoRA policy"):
        tunix_compat.attach_vocab_table(base, "bfloat16")  # full weights: the embedding trains
    with pytest.raises(ValueError, match="expected one of"):
        tunix_compat.attach_vocab_table(lora_clone(recipe, base), "float16")
    assert getattr(base.embedder, "vocab_table", None) is None
