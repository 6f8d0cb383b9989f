"""stages/modeling/sampling.py: a categorical draw from one uniform per row, and
tunix_compat.set_draw, which puts it in a Tunix sampler (GRPO's `draw: inverse_cdf`). Tunix
0.1.7's draw at top_p 1 (Gumbel-max) takes a random number per vocabulary entry and row; this
takes one a row, from the same distribution."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pydantic import ValidationError
from tunix.generate import sampler as tunix_sampler

from schemas.recipe import EvalConfig, GRPOConfig, SelfTeachConfig
from stages import self_teach
from stages.core.runner import RunContext
from stages.modeling import fast_paths, models, sampling, tunix_compat
from stages.modeling.generation import build_sampler, generate
from stages.modeling.tokenizers import build_tokenizer
from tests.conftest import recipe_with


def random_numbers_drawn(fn: Any, *args: Any) -> int:
    """How many random numbers `fn(*args)`'s program draws (its random_bits primitives)."""

    def walk(jaxpr: Any) -> int:
        total = 0
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "random_bits":
                total += int(np.prod(eqn.params["shape"]))
            for param in eqn.params.values():
                inner = getattr(param, "jaxpr", None)
                if inner is not None:
                    total += walk(getattr(inner, "jaxpr", inner))
        return total

    return walk(jax.make_jaxpr(fn)(*args).jaxpr)


def test_tunix_draws_a_number_per_vocabulary_entry_this_draws_one_per_row() -> None:
    rows, vocab = 4, 1000
    logits = jnp.zeros((rows, 1, vocab))
    key = jax.random.PRNGKey(0)
    theirs = random_numbers_drawn(
        lambda k, x: tunix_sampler.sample_top_p(x, k, 1.0, 1.0, None), key, logits
    )
    ours = random_numbers_drawn(
        lambda k, x: tunix_compat._sample_top_p(x, k, 1.0, 1.0, None), key, logits
    )
    assert (theirs, ours) == (rows * vocab, rows)


@pytest.mark.parametrize("vocab", [1, 2, 7, 10, 50])
def test_draws_follow_the_softmax_and_never_a_zero_probability_entry(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    probs = rng.dirichlet(np.ones(vocab))
    probs[rng.random(vocab) < 0.3] = 0.0  # some entries impossible (logit -inf)
    if probs.sum() == 0:
        probs[-1] = 1.0
    probs /= probs.sum()
    logits = jnp.log(jnp.asarray(np.tile(probs, (8, 1)), jnp.float32))  # 8 rows, -inf at zeros
    keys = jax.random.split(jax.random.PRNGKey(vocab), 4000)
    draws = np.asarray(
        jax.jit(jax.vmap(lambda k: sampling.inverse_cdf_categorical(k, logits)))(keys)
    )
    assert draws.shape == (4000, 8)
    counts = np.bincount(draws.ravel(), minlength=vocab)
    assert counts[probs == 0].sum() == 0
    n = draws.size
    # each entry's count within 5 binomial standard deviations (one entry failing by chance:
    # under 1e-5)
    sigma = np.sqrt(n * probs * (1 - probs))
    assert np.all(np.abs(counts - n * probs) <= 5 * sigma + 1e-9), (counts / n, probs)


def test_a_certain_entry_in_any_block_is_always_drawn() -> None:
    vocab = 1000  # 32 blocks of 32: the first, a middle and the last entry, and one in the pad
    for index in (0, 517, 999):
        logits = jnp.full((3, vocab), -jnp.inf).at[:, index].set(0.0)
        keys = jax.random.split(jax.random.PRNGKey(index), 50)
        draws = jax.vmap(lambda k, x=logits: sampling.inverse_cdf_categorical(k, x))(keys)
        assert set(np.asarray(draws).ravel()) == {index}


def test_leading_axes_are_kept() -> None:
    draws = sampling.inverse_cdf_categorical(jax.random.PRNGKey(0), jnp.zeros((2, 3, 11)))
    assert draws.shape == (2, 3) and draws.dtype == jnp.int32


def test_the_patched_sampler_path_keeps_logprobs_and_tunixs_filtered_paths() -> None:
    logits = jax.random.normal(jax.random.PRNGKey(1), (4, 1, 64))
    key = jax.random.PRNGKey(2)
    token, logp = tunix_compat._sample_top_p(logits, key, 0.7, 1.0, None, return_logprobs=True)
    expected = jax.nn.log_softmax(logits[:, -1] / 0.7, axis=-1)[jnp.arange(4), token]
    np.testing.assert_allclose(np.asarray(logp), np.asarray(expected), rtol=1e-6)
    for top_p, top_k in ((0.9, None), (1.0, 5)):  # filtered: Tunix's own draw, unchanged
        ours = tunix_compat._sample_top_p(logits, key, 0.7, top_p, top_k, True)
        theirs = tunix_sampler.sample_top_p(logits, key, 0.7, top_p, top_k, True)
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The smoke recipe's tiny network: (recipe, mesh, network, tokenizer)."""
    root = str(tmp_path_factory.mktemp("tiny"))
    recipe = recipe_with(root)
    mesh = models.build_mesh(recipe.mesh)
    network = models.build_base_model(recipe.model, mesh, root)
    return recipe, mesh, network, build_tokenizer(recipe.model, root)


@pytest.fixture
def draw_path() -> Any:
    """FAR's draw installed in Tunix's Sampler for the test, as a sampling stage has it."""
    with fast_paths.installed("draw"):
        yield


def test_a_draw_other_than_tunixs_is_refused_outside_the_fast_path(tiny: Any) -> None:
    recipe, _, network, tokenizer = tiny
    sampler = build_sampler(network, tokenizer, recipe.model, recipe.data.max_prompt_len, 8)
    tunix_compat.set_draw(sampler, "gumbel")  # Tunix's own: nothing to install
    with pytest.raises(RuntimeError, match=r"fast_paths.installed\('draw'\)"):
        tunix_compat.set_draw(sampler, "inverse_cdf")


def test_a_sampler_draws_by_its_own_draw_and_keeps_it(tiny: Any, draw_path: None) -> None:
    """The real Tunix sampler on the tiny smoke model, through the shared sampling loop
    (`generate(draw=...)`, which sets the sampler's draw): the same seed draws the same
    completions, another seed others, and Tunix's own draw from the same seed differs. The
    draw is the sampler's: a call made inside another sampler's trace, or with another draw
    after it has sampled, cannot change it (the second is refused, not silently ignored)."""
    recipe, mesh, network, tokenizer = tiny
    length = recipe.data.max_prompt_len
    prompts = ["Calculate 1 + 2.", "Calculate 3 - 4."]

    def draw(sampler: Any, seed: int, how: str) -> list[str]:
        with mesh:
            return generate(
                sampler,
                tokenizer,
                prompts,
                prompt_len=length,
                max_tokens=8,
                batch_size=2,
                temperature=1.0,
                seed=seed,
                draw=how,
            )

    tunix_own = tunix_sampler.sample_top_p
    inverse = build_sampler(network, tokenizer, recipe.model, length, 8)
    first = draw(inverse, 0, "inverse_cdf")
    assert tunix_sampler.sample_top_p is tunix_own  # swapped only while a decode step traces
    assert draw(inverse, 0, "inverse_cdf") == first and draw(inverse, 1, "inverse_cdf") != first
    gumbel = build_sampler(network, tokenizer, recipe.model, length, 8)
    tunix_compat.set_draw(gumbel, "gumbel")
    tunix_sampler.sample_top_p = tunix_compat._sample_top_p  # an outer "block" of another draw
    try:
        with mesh:
            result = gumbel(
                prompts,
                max_generation_steps=8,
                max_prompt_length=length,
                seed=0,
                eos_tokens=[tokenizer.eos_id(), tokenizer.end_of_turn_id()],
                temperature=1.0,
                top_p=1.0,
            )
    finally:
        tunix_sampler.sample_top_p = tunix_own
    assert list(result.text) != first  # it traced with its own draw, Tunix's
    assert draw(gumbel, 0, "gumbel") != first
    with pytest.raises(ValueError, match="build another sampler"):
        draw(gumbel, 0, "inverse_cdf")  # its compiled decode step keeps Tunix's draw
    with pytest.raises(ValueError, match="expected one of"):
        tunix_compat.set_draw(gumbel, "exact")


def test_self_teach_samples_with_its_draw(
    tiny: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, draw_path: None
) -> None:
    recipe, mesh, network, tokenizer = tiny
    traced = spy_on_inverse_cdf(monkeypatch)
    config = SelfTeachConfig(
        samples=2, temperature=1.0, draw="inverse_cdf", max_generation_tokens=8, batch_size=2
    )
    rows = [
        {"id": "a", "prompt": "Calculate 1 + 2.", "answer": "3"},
        {"id": "b", "prompt": "Calculate 3 - 4.", "answer": "-1"},
    ]
    length = recipe.data.max_prompt_len
    sampler = build_sampler(network, tokenizer, recipe.model, length, 8)
    ctx = RunContext(str(tmp_path), "t")
    with mesh:
        samples = self_teach._sample_chunks(
            str(tmp_path / "teach"), rows, sampler, tokenizer, config, length, ctx
        )
    assert [s["prompt_id"] for s in samples] == ["a", "a", "b", "b"]
    assert traced  # the sampler traced its decode step with the inverse-CDF draw


def spy_on_inverse_cdf(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows each time a sampler traces the inverse-CDF draw."""
    traced: list[int] = []
    inverse_cdf = tunix_compat.DRAWS["inverse_cdf"]

    def tracing(*args: Any, **kwargs: Any) -> Any:
        traced.append(1)
        return inverse_cdf(*args, **kwargs)

    monkeypatch.setitem(tunix_compat.DRAWS, "inverse_cdf", tracing)
    return traced


def test_inverse_cdf_with_a_sampling_filter_or_greedy_decoding_is_refused() -> None:
    required = {"max_steps": 1, "batch_size": 1}
    GRPOConfig(draw="inverse_cdf", top_p=None, **required)
    for filters in ({"top_p": 0.9}, {"top_k": 40}):
        with pytest.raises(ValidationError, match="draw: inverse_cdf draws from the whole"):
            GRPOConfig(draw="inverse_cdf", **filters, **required)
    EvalConfig(draw="inverse_cdf", temperature=1.0)
    with pytest.raises(ValidationError, match="draw: inverse_cdf chooses how sampled tokens"):
        EvalConfig(draw="inverse_cdf")  # greedy: nothing is drawn
