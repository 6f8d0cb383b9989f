"""Train SFT on the tiny model in a process of its own with JAX's persistent compilation cache.

usage: python -m tests.integration._compile_cache_child ROOT CACHE_ROOT

Prints one JSON line: the cache directory, persistent-cache hits and misses, the final loss
and a digest of the trained LoRA weights.
"""

from __future__ import annotations

import hashlib
import json
import sys

from schemas.record import StageRecord
from stages import sft
from stages.core import storage
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.modeling import compile_cache
from tests.conftest import recipe_with
from tests.integration.test_sft_full import lora_leaves


def main(argv: list[str]) -> int:
    root, cache_root = argv
    directory = compile_cache.enable(cache_root)  # this process's entry point
    recipe = recipe_with(root, sft={"max_steps": 2}, model={"architecture": {"num_layers": 1}})
    ctx = RunContext(root=root, run="cached")
    with compile_cache.counting_cache_use() as stats:
        dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
        outcome = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx)
    record = StageRecord.model_validate(storage.read_json(outcome.record_uri))
    digest = hashlib.sha256(b"".join(x.tobytes() for x in lora_leaves(outcome.output)))
    result = {
        "directory": directory,
        "hits": stats.hits,
        "misses": stats.misses,
        "final_loss": record.metrics["final_loss"],
        "lora_sha256": digest.hexdigest(),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
