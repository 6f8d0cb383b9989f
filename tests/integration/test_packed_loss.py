"""On the tiny model: each example's loss in a packed row equals its loss alone, unpacked."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from stages.data_prep.packing import pack_rows
from stages.modeling import models
from stages.sft import model_inputs
from tests.conftest import recipe_with


def per_segment_loss(network: object, arrays: dict[str, np.ndarray]) -> dict[tuple, float]:
    """Mean next-token loss over each segment's masked targets, keyed by its tokens."""
    inputs = model_inputs({k: jnp.asarray(v) for k, v in arrays.items()})
    logits, _ = network(
        inputs["input_tokens"],
        inputs["positions"],
        None,  # type: ignore[operator]
        inputs["attention_mask"],
    )
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    targets = arrays["input_tokens"][:, 1:]
    nll = -np.take_along_axis(np.asarray(logp), targets[..., None], axis=-1)[..., 0]
    out = {}
    for r in range(targets.shape[0]):
        segments = arrays["segment_ids"][r]
        for s in range(1, int(segments.max()) + 1):
            where = np.flatnonzero(segments == s)
            # target t+1 belongs to segment s when token t+1 does and its mask is on
            tgt = [t for t in where[:-1] if arrays["input_mask"][r, t + 1]]
            key = tuple(arrays["input_tokens"][r, where].tolist())
            out[key] = float(nll[r, tgt].mean())
    return out


def test_packed_loss_equals_unpacked_loss() -> None:
    recipe = recipe_with("/tmp/unused")
    mesh = models.build_mesh(recipe.mesh)
    network = models.build_base_model(recipe.model, mesh, cache_dir="unused")
    rng = np.random.default_rng(0)
    seqs = []
    for length in (9, 14, 5, 20, 7, 11):
        tokens = rng.integers(16, 270, size=length).tolist()
        prompt = length // 2
        seqs.append((tokens, [0] * prompt + [1] * (length - prompt)))
    with mesh:
        alone = per_segment_loss(network, pack_rows(seqs, 24, 0, packing=False))
        packed_arrays = pack_rows(seqs, 24, 0, packing=True)
        packed = per_segment_loss(network, packed_arrays)
    assert packed_arrays["input_tokens"].shape[0] < len(seqs)  # really packed
    assert alone.keys() == packed.keys()
    for key, loss in alone.items():
        np.testing.assert_allclose(packed[key], loss, rtol=1e-5)
