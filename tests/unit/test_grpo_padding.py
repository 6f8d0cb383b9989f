"""grpo.trim_padding (tunix_compat.trim_train_example), grpo.skip_flat_groups
(advantages.informative_rows) and grpo.share_prompts (tunix_compat.share_group_prompts): the
actor update without the columns no row of the step uses, without the groups that carry no
gradient, and with each group's prompt run once. Tunix pads every prompt to max_prompt_len
and every completion to max_generation_tokens; the cut example keeps each side to its
longest row rounded up to the multiple. Tunix repeats each prompt num_generations times; the
shared example keeps one row of each. All give Tunix's GRPO loss and its adapter gradients
to float rounding on a tiny Gemma 3 with LoRA."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.rl import algo_core
from tunix.rl import common as rl_common
from tunix.rl.grpo import drgrpo_learner, grpo_learner

from schemas.recipe import GRPOConfig, LoraSpec
from stages.grpo import advantages, training
from stages.modeling import fast_paths, models, tunix_compat
from tests.conftest import recipe_with

PAD, EOS = 0, 1
PROMPT_CAP, COMPLETION_CAP = 24, 16
PROMPT_LENGTHS = (5, 11, 3, 7)  # longest 11: kept to 16 with multiple 8
COMPLETION_LENGTHS = (3, 9, 0, 5)  # longest 9: kept to 16 = the cap with 8, 12 with 4


def tunix_example(vocab: int = 256, seed: int = 0) -> rl_common.TrainExample:
    """A step's example as Tunix's GRPO learner builds it: prompts left-padded to the cap,
    completions right-padded to the cap, masks `ids != pad`."""
    rng = np.random.default_rng(seed)
    rows = len(PROMPT_LENGTHS)
    prompts = np.full((rows, PROMPT_CAP), PAD, np.int32)
    completions = np.full((rows, COMPLETION_CAP), PAD, np.int32)
    for row, (p, c) in enumerate(zip(PROMPT_LENGTHS, COMPLETION_LENGTHS, strict=True)):
        prompts[row, PROMPT_CAP - p :] = rng.integers(2, vocab, p)
        completions[row, :c] = rng.integers(2, vocab, c)
    old = rng.normal(-3.0, 0.5, (rows, COMPLETION_CAP)).astype(np.float32)
    return rl_common.TrainExample(
        prompt_ids=jnp.asarray(prompts),
        prompt_mask=jnp.asarray(prompts != PAD),
        completion_ids=jnp.asarray(completions),
        completion_mask=jnp.asarray(completions != PAD),
        advantages=jnp.asarray([1.0, -0.5, 0.0, 2.0]),
        ref_per_token_logps=jnp.asarray(old - 0.1),
        old_per_token_logps=jnp.asarray(old),
    )


def test_the_cut_keeps_every_used_column_rounded_up_to_the_multiple() -> None:
    example = tunix_example()
    assert example.prompt_ids.shape == (4, PROMPT_CAP)  # Tunix: the caps, whatever is used
    cut = tunix_compat.trim_train_example(example, 4)
    assert cut.prompt_ids.shape == (4, 12) and cut.completion_ids.shape == (4, 12)
    # the right end of the prompts, the left end of the completions, nothing else
    np.testing.assert_array_equal(cut.prompt_ids, example.prompt_ids[:, -12:])
    np.testing.assert_array_equal(cut.prompt_mask, example.prompt_mask[:, -12:])
    np.testing.assert_array_equal(cut.completion_ids, example.completion_ids[:, :12])
    np.testing.assert_array_equal(cut.completion_mask, example.completion_mask[:, :12])
    np.testing.assert_array_equal(cut.old_per_token_logps, example.old_per_token_logps[:, :12])
    np.testing.assert_array_equal(cut.ref_per_token_logps, example.ref_per_token_logps[:, :12])
    np.testing.assert_array_equal(cut.advantages, example.advantages)
    # every real token is still there
    assert int(cut.prompt_mask.sum()) == sum(PROMPT_LENGTHS)
    assert int(cut.completion_mask.sum()) == sum(COMPLETION_LENGTHS)
    # multiple 8: the prompts 11 -> 16, the completions 9 -> 16 (the cap)
    eight = tunix_compat.trim_train_example(example, 8)
    assert eight.prompt_ids.shape == (4, 16) and eight.completion_ids.shape == (4, 16)


def test_edge_widths_never_cut_a_token_and_never_reach_zero() -> None:
    example = tunix_example()
    # a multiple beyond the caps keeps the caps (nothing to cut)
    whole = tunix_compat.trim_train_example(example, 64)
    assert whole.prompt_ids.shape == (4, PROMPT_CAP)
    assert whole.completion_ids.shape == (4, COMPLETION_CAP)
    # every completion empty (each row ended at once): one column, not zero
    empty = example.replace(
        completion_ids=jnp.zeros_like(example.completion_ids),
        completion_mask=jnp.zeros_like(example.completion_mask),
    )
    assert tunix_compat.trim_train_example(empty, 4).completion_ids.shape == (4, 1)
    # a loss normalised by the completion width (Dr. GRPO) keeps the width
    kept = tunix_compat.trim_train_example(example, 4, completions=False)
    assert kept.prompt_ids.shape == (4, 12)
    assert kept.completion_ids.shape == (4, COMPLETION_CAP)
    assert kept.old_per_token_logps.shape == (4, COMPLETION_CAP)


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    root = str(tmp_path_factory.mktemp("padding"))
    recipe = recipe_with(root)
    mesh = models.build_mesh(recipe.mesh)
    with mesh:
        network = models.apply_lora(
            models.build_base_model(recipe.model, mesh, root), LoraSpec(rank=4, alpha=8.0), mesh
        )
    adapters = nnx.state(network, nnx.LoRAParam)  # B starts at 0: move it so LoRA counts
    nnx.update(network, jax.tree.map(lambda x: x + 0.01, adapters))
    return network, mesh


def compiled_loss_and_grads(
    network: Any, example: Any, algo: Any
) -> tuple[float, list[np.ndarray], float]:
    """Tunix's GRPO loss of `example`, its gradient with respect to the adapters and the
    compiled FLOPs of that computation: one jit of loss and gradient, the weights passed as
    arguments (not folded in as constants), so each example compiles once."""
    algo.temperature = 1.0  # Tunix's learner sets it from the rollout config
    graphdef, adapters, frozen = nnx.split(network, nnx.LoRAParam, ...)

    def of(trained: Any, rest: Any) -> Any:
        model = nnx.merge(graphdef, trained, rest)
        return algo_core.grpo_loss_fn(model, example, algo, PAD, EOS)[0]

    compiled = jax.jit(jax.value_and_grad(of)).lower(adapters, frozen).compile()
    loss, grads = compiled(adapters, frozen)
    flops = float(compiled.cost_analysis()["flops"])
    return float(loss), [np.asarray(g) for g in jax.tree.leaves(grads)], flops


def loss_and_grads(network: Any, example: Any, algo: Any) -> tuple[float, list[np.ndarray]]:
    """Tunix's GRPO loss of `example` and its gradient with respect to the adapters."""
    loss, grads, _ = compiled_loss_and_grads(network, example, algo)
    return loss, grads


@pytest.mark.parametrize(
    "algo",
    [
        grpo_learner.GRPOConfig(num_generations=2, beta=0.0),
        drgrpo_learner.DrGRPOConfig(num_generations=2, beta=0.0),
    ],
    ids=["grpo", "dr-grpo"],
)
def test_the_cut_example_gives_the_same_loss_and_gradients(
    policy: tuple[Any, Any], algo: Any
) -> None:
    """Same tokens at the same positions: only the attention's sums over keys are shorter.
    Tolerances: float rounding of f32 sums (relative 1e-5 on the loss; gradients 2e-4
    relative, 1e-4 of the leaf's largest entry absolute, as the completion-only projection)."""
    network, mesh = policy
    vocab = network.embedder.input_embedding.value.shape[0]
    example = tunix_example(vocab)
    completions = not isinstance(algo, drgrpo_learner.DrGRPOConfig)
    cut = tunix_compat.trim_train_example(example, 4, completions=completions)
    assert cut.prompt_ids.shape[1] < PROMPT_CAP
    with mesh:
        loss, grads = loss_and_grads(network, example, algo)
        cut_loss, cut_grads = loss_and_grads(network, cut, algo)
    assert loss != 0.0 and cut_loss == pytest.approx(loss, rel=1e-5)
    for a, b in zip(cut_grads, grads, strict=True):
        scale = float(np.abs(b).max())
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-4 * scale)
    assert any(float(np.abs(g).max()) > 0 for g in grads)


def test_dr_grpo_would_change_if_its_completions_were_cut(policy: tuple[Any, Any]) -> None:
    """Why dr-grpo keeps the completion's width: its loss divides by it."""
    network, mesh = policy
    vocab = network.embedder.input_embedding.value.shape[0]
    example = tunix_example(vocab)
    algo = drgrpo_learner.DrGRPOConfig(num_generations=2, beta=0.0)
    with mesh:
        loss, _ = loss_and_grads(network, example, algo)
        cut, _ = loss_and_grads(network, tunix_compat.trim_train_example(example, 4), algo)
    assert cut == pytest.approx(loss * COMPLETION_CAP / 12, rel=1e-4)


def assert_same_update(network: Any, mesh: Any, example: Any, cut: Any) -> None:
    """Tunix's GRPO loss (two generations, no KL) and its adapter gradients are the same for
    `cut` as for the full `example`, to float rounding."""
    algo = grpo_learner.GRPOConfig(num_generations=2, beta=0.0)
    with mesh:
        loss, grads = loss_and_grads(network, example, algo)
        cut_loss, cut_grads = loss_and_grads(network, cut, algo)
    assert loss != 0.0 and cut_loss == pytest.approx(loss, rel=1e-5)
    for a, b in zip(cut_grads, grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-4 * float(np.abs(b).max()))


def test_flat_groups_leave_the_update_with_the_same_loss_and_gradients(
    policy: tuple[Any, Any],
) -> None:
    """skip_flat_groups then trim_padding, as the stage composes them. Two groups of two:
    rows 2-3 (advantage 0) add nothing, and Tunix divides by the non-empty rows (3: row 2's
    completion is empty), so rows 0-1 with advantages scaled by 2/3 give the full loss;
    tolerances as above."""
    network, mesh = policy
    vocab = network.embedder.input_embedding.value.shape[0]
    example = tunix_example(vocab).replace(advantages=jnp.asarray([1.0, -1.0, 0.0, 0.0]))
    config = GRPOConfig(
        max_steps=1,
        batch_size=2,
        num_generations=2,
        beta=0.0,
        skip_flat_groups=True,
        trim_padding=4,
    )
    transform = training.example_transform(config)
    assert transform is not None
    cut = transform(example)
    assert cut.prompt_ids.shape == (2, 12) and cut.completion_ids.shape == (2, 12)
    np.testing.assert_allclose(cut.advantages, [2 / 3, -2 / 3], rtol=1e-6)
    assert_same_update(network, mesh, example, cut)


def rows_example(group_advantages: list[float], generations: int = 2) -> Any:
    rows = len(group_advantages) * generations
    advantages = np.repeat(np.asarray(group_advantages, np.float32), generations)
    advantages[::generations] *= -1  # an informative group's rows differ in sign
    ids = np.arange(rows, dtype=np.int32)[:, None] + 2
    return rl_common.TrainExample(
        prompt_ids=jnp.asarray(ids),
        prompt_mask=jnp.asarray(ids != PAD),
        completion_ids=jnp.asarray(ids),
        completion_mask=jnp.asarray(ids != PAD),
        advantages=jnp.asarray(advantages),
        ref_per_token_logps=None,
        old_per_token_logps=jnp.asarray(ids, jnp.float32),
    )


@pytest.mark.parametrize(
    ("groups", "kept", "scale"),
    [
        ([0.0, 1.0, 0.0, 0.0], [1], 2 / 8),  # one informative group: one group
        ([1.0, 0.0, 0.0, 2.0], [0, 3], 4 / 8),
        ([1.0, 0.0, 2.0, 3.0], [0, 1, 2, 3], 1.0),  # 3 -> 4 (a power of two): a flat one fills
        ([0.0, 0.0, 0.0, 0.0], [0], 2 / 8),  # no gradient at all: one group, advantages 0
        ([1.0, 2.0, 3.0, 4.0], [0, 1, 2, 3], 1.0),
    ],
)
def test_informative_rows_keeps_whole_groups_in_order(
    groups: list[float], kept: list[int], scale: float
) -> None:
    example = rows_example(groups)
    out = advantages.informative_rows(example, 2)
    rows = [2 * g + i for g in kept for i in range(2)]
    np.testing.assert_array_equal(out.prompt_ids[:, 0], np.asarray(rows) + 2)
    np.testing.assert_array_equal(out.old_per_token_logps[:, 0], np.asarray(rows) + 2)
    np.testing.assert_allclose(out.advantages, np.asarray(example.advantages)[rows] * scale)
    assert out.ref_per_token_logps is None


def test_the_recipe_refuses_skip_flat_groups_where_flat_rows_still_count() -> None:
    base = {"max_steps": 1, "batch_size": 4, "skip_flat_groups": True}
    assert GRPOConfig(**base, beta=0.0).skip_flat_groups
    assert GRPOConfig(**base, beta=0.0, train_micro_batch_size=4).skip_flat_groups
    for changes, message in [
        ({"beta": 0.04}, "needs beta: 0"),
        ({"beta": 0.0, "algorithm": "dr-grpo"}, "algorithm is 'dr-grpo'"),
        ({"beta": 0.0, "train_micro_batch_size": 2}, "one micro-batch a step"),
    ]:
        with pytest.raises(ValueError, match=message):
            GRPOConfig(**base, **changes)
    assert training.example_transform(GRPOConfig(max_steps=1, batch_size=4)) is None


class _Learner:
    """Stands in for Tunix's learner (which needs a whole RLCluster): the one method
    transform_train_examples wraps, returning the example Tunix would."""

    def _generate_and_compute_advantage(self, batch: Any, mode: Any = None) -> Any:
        del batch, mode
        return tunix_example()


def test_the_learner_hands_the_actor_the_cut_example() -> None:
    assert callable(grpo_learner.GRPOLearner._generate_and_compute_advantage)  # the name wrapped
    learner = _Learner()
    tunix_compat.transform_train_examples(
        learner, lambda example: tunix_compat.trim_train_example(example, 8)
    )
    example = learner._generate_and_compute_advantage({}, "train")
    assert example.prompt_ids.shape == (4, 16)
    # other instances (and the class) keep Tunix's
    assert _Learner()._generate_and_compute_advantage({}).prompt_ids.shape == (4, PROMPT_CAP)


def test_the_recipe_field_is_a_positive_multiple_or_off() -> None:
    base = {"max_steps": 1, "batch_size": 2}
    assert GRPOConfig(**base).trim_padding is None
    assert GRPOConfig(**base, trim_padding=8).trim_padding == 8
    with pytest.raises(ValueError, match="greater than 0"):
        GRPOConfig(**base, trim_padding=0)


def grouped_example(vocab: int, generations: int = 2) -> rl_common.TrainExample:
    """tunix_example's first two prompts, each repeated `generations` times as Tunix's GRPO
    learner repeats them, with a completion of its own per row."""
    example = tunix_example(vocab)
    rows = np.repeat(np.arange(2), generations)
    completions = tunix_example(vocab, seed=1)
    take = np.arange(2 * generations) % 4
    return example.replace(
        prompt_ids=example.prompt_ids[rows],
        prompt_mask=example.prompt_mask[rows],
        completion_ids=completions.completion_ids[take],
        completion_mask=completions.completion_mask[take],
        advantages=jnp.asarray(np.linspace(-1.0, 1.5, 2 * generations), jnp.float32),
        ref_per_token_logps=completions.ref_per_token_logps[take],
        old_per_token_logps=completions.old_per_token_logps[take],
    )


def test_shared_prompts_keep_one_row_per_group_and_only_for_equal_runs() -> None:
    example = grouped_example(256)
    shared = tunix_compat.share_group_prompts(example, 2)
    np.testing.assert_array_equal(shared.prompt_ids, example.prompt_ids[::2])
    np.testing.assert_array_equal(shared.prompt_mask, example.prompt_mask[::2])
    np.testing.assert_array_equal(shared.completion_ids, example.completion_ids)
    assert tunix_compat.prompt_group(shared.prompt_ids, shared.completion_ids) == 2
    # rows that are not runs of equal prompts, a group that does not divide them, group 1:
    # unchanged (the full pass)
    for unchanged in (
        tunix_compat.share_group_prompts(tunix_example(), 2),
        tunix_compat.share_group_prompts(example, 3),
        tunix_compat.share_group_prompts(example, 1),
    ):
        assert unchanged.prompt_ids.shape[0] == unchanged.completion_ids.shape[0]
    with pytest.raises(ValueError, match="3 prompt rows for 4 completion rows"):
        tunix_compat.prompt_group(example.prompt_ids[:3], example.completion_ids)


@pytest.fixture
def completion_logps() -> Any:
    """FAR's completion-only log-probs installed in Tunix for the test, as GRPO has them (a
    prompt row per group needs them: Tunix's own function expects a row per completion)."""
    with fast_paths.installed("completion_logps"):
        yield


@pytest.mark.parametrize("window", [None, 8], ids=["shared", "window-too-short"])
def test_shared_prompts_give_the_same_loss_and_gradients(
    policy: tuple[Any, Any], window: int | None, completion_logps: None
) -> None:
    """Each group's prompt runs once into a key/value cache that its completions attend to:
    the same loss and adapter gradients as the full pass (tolerances as above), for fewer
    compiled FLOPs. A sliding window shorter than the sequence (window 8 here) runs the full
    pass instead, with the prompts repeated back: the same numbers, the full FLOPs."""
    network, mesh = policy
    vocab = network.embedder.input_embedding.value.shape[0]
    grouped = grouped_example(vocab, generations=4)
    shared = tunix_compat.share_group_prompts(grouped, 4)
    assert shared.prompt_ids.shape == (2, PROMPT_CAP)
    algo = grpo_learner.GRPOConfig(num_generations=4, beta=0.0)
    layers = [layer.attn for layer in network.layers]
    kept = [(attn.attn_type, attn.sliding_window_size) for attn in layers]
    try:
        if window is not None:  # every layer a sliding-window one, with a short window
            for attn in layers:
                attn.attn_type = tunix_compat.gemma3_model.AttentionType.LOCAL_SLIDING
                attn.sliding_window_size = window
        with mesh:
            loss, grads, full_flops = compiled_loss_and_grads(network, grouped, algo)
            shared_loss, shared_grads, shared_flops = compiled_loss_and_grads(network, shared, algo)
    finally:
        for attn, (kind, size) in zip(layers, kept, strict=True):
            attn.attn_type, attn.sliding_window_size = kind, size
    assert loss != 0.0 and shared_loss == pytest.approx(loss, rel=1e-5)
    for a, b in zip(shared_grads, grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-4 * float(np.abs(b).max()))
    assert any(float(np.abs(g).max()) > 0 for g in grads)
    if window is None:
        assert shared_flops < 0.8 * full_flops
    else:  # the full pass: no fewer FLOPs
        assert shared_flops >= 0.99 * full_flops


def test_the_recipe_composes_shared_prompts_after_the_cut() -> None:
    config = GRPOConfig(
        max_steps=1, batch_size=2, num_generations=2, beta=0.0, trim_padding=4, share_prompts=True
    )
    transform = training.example_transform(config)
    assert transform is not None
    out = transform(grouped_example(256))
    assert out.prompt_ids.shape == (2, 12) and out.completion_ids.shape == (4, 12)
    with pytest.raises(ValueError, match="share_prompts needs one micro-batch a step"):
        GRPOConfig(max_steps=1, batch_size=4, share_prompts=True, train_micro_batch_size=2)
    grpo = {"batch_size": 3, "share_prompts": True}
    assert recipe_with("/tmp/unused", grpo=grpo).grpo.share_prompts
    with pytest.raises(ValueError, match=r"grpo.batch_size \(3\) must be a multiple of mesh.fsdp"):
        recipe_with("/tmp/unused", grpo=grpo, mesh={"fsdp": 2})


def test_flat_groups_then_shared_prompts_give_the_same_loss_and_gradients(
    policy: tuple[Any, Any], completion_logps: None
) -> None:
    """skip_flat_groups, trim_padding and share_prompts, as the stage composes them: the flat
    second group is dropped, its one informative group keeps one prompt row for its two
    completions, and Tunix's loss and adapter gradients equal the full step's (tolerances as
    above)."""
    network, mesh = policy
    vocab = network.embedder.input_embedding.value.shape[0]
    example = grouped_example(vocab).replace(advantages=jnp.asarray([1.0, -1.0, 0.0, 0.0]))
    config = GRPOConfig(
        max_steps=1,
        batch_size=2,
        num_generations=2,
        beta=0.0,
        skip_flat_groups=True,
        trim_padding=4,
        share_prompts=True,
    )
    transform = training.example_transform(config)
    assert transform is not None
    cut = transform(example)
    assert cut.prompt_ids.shape[0] == 1 and cut.completion_ids.shape[0] == 2
    assert_same_update(network, mesh, example, cut)
