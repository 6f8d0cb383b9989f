"""The TPU recipes scaled to the tiny model, so their stage settings train on CPU in a test.

`scaled(name, root)` takes recipes/<name>.yaml and replaces only what a CPU cannot run or a
test cannot wait for: the model (a tiny random network of the recipe's own family and dtype,
the byte tokenizer), the data (the hub is unreachable here: the smoke recipe's offline
generator, prompt length and split sizes, and rows of 320 tokens, which pack two examples),
step counts, checkpoint cadence and generation lengths. The mesh stays the recipe's: the
tests give the process as many CPU devices as it names. Every other stage setting
(micro-batch sizes, gradient accumulation, packing, GRPO micro-batches, num_iterations,
algorithm, clipping, KL, temperature, rewards, learning rates, LoRA, evaluation models and
batch size, dtype) is the recipe's exactly; tests/unit/test_scaled_recipes.py pins that the
scaled recipe differs in `SCALED` fields only.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from pipeline.recipes import parse_recipe
from schemas.recipe import Recipe
from tests.conftest import REPO

TPU_RECIPES = ("tpu-gemma3-1b-v5e8", "tpu-gemma3-1b-v5e16-multihost", "kaggle-gemma2-2b-v5e8")
# The ones trained on CPU (tests/integration/test_tpu_recipes.py). tpu-gemma3-1b-v5e8 is
# tpu-gemma3-1b-v5e16-multihost on half the chips (tests/unit/test_scaled_recipes.py pins that
# they differ in name and mesh.fsdp only): the v5e16 run trains its Gemma 3 settings at fsdp 16,
# the Kaggle run trains fsdp 8, so a third run would repeat them (~80 s of the suite).
TRAINED_RECIPES = ("tpu-gemma3-1b-v5e16-multihost", "kaggle-gemma2-2b-v5e8")
# The recipe the stop and kill tests resume, and what each trained recipe's full run changes
# on top of the scaling (tests/unit/test_scaled_recipes.py pins these fields and no others):
# - the Kaggle run's GRPO takes num_iterations 2, the kill test's setting, so its GRPO record is
#   the uninterrupted run a killed one must resume to (the recipe's 1 is the v5e16 run's);
# - the v5e16 run keeps what its mesh needs checked: two SFT updates (the second window's
#   micro-batches run the step after an update, where a changed sharding would recompile it),
#   two GRPO steps, and one LoRA model evaluated. The Kaggle run evaluates every model (base,
#   its 3-shot row, sft, grpo: each program once), takes the third updates the stop test
#   resumes across, and checkpoints GRPO's third step the kill test waits past.
STOP_RECIPE = "kaggle-gemma2-2b-v5e8"
FULL_RUN_CHANGES: dict[str, dict[str, dict[str, Any]]] = {
    STOP_RECIPE: {"grpo": {"num_iterations": 2}},
    "tpu-gemma3-1b-v5e16-multihost": {
        "sft": {"max_steps": 2},
        "grpo": {"max_steps": 2},
        "eval": {"models": ["grpo"]},
    },
}

# Dotted paths the scaling replaces (a path covers everything below it).
SCALED = (
    "storage_root",
    "model",
    "data.eval",
    "data.grpo",
    "data.sft",
    "data.max_seq_len",
    "data.max_prompt_len",
    "sft.max_steps",
    "sft.checkpoint_every_steps",
    "grpo.max_steps",
    "grpo.checkpoint_every_steps",
    "grpo.max_generation_tokens",
    "eval.max_generation_tokens",
)

# SFT: three optimizer updates (whole accumulation windows), a checkpoint every second one,
# so a stop inside the second window falls after an update that has no checkpoint yet.
# GRPO: three prompt batches, a checkpoint after every one.
SFT_STEPS = 3
SFT_CHECKPOINT_EVERY = 2
GRPO_STEPS = 3
GENERATION_TOKENS = 16
# The generator's SFT examples take 123-155 tokens: 320 packs two into most rows (the
# smoke recipe's 160 holds one, and packing would change nothing)
PACKED_LEN = 320


def recipe_data(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())


def scaled_data(name: str, root: str, **changes: dict[str, Any]) -> dict[str, Any]:
    """recipes/<name>.yaml with the SCALED fields replaced (and `changes` merged last)."""
    data = copy.deepcopy(recipe_data(name))
    smoke = recipe_data("smoke")
    data["storage_root"] = root
    data["model"] = {
        **smoke["model"],
        "family": data["model"]["family"],
        "dtype": data["model"]["dtype"],
    }
    for split in ("eval", "grpo", "sft"):
        data["data"][split] = smoke["data"][split]
    data["data"]["max_seq_len"] = PACKED_LEN
    data["data"]["max_prompt_len"] = smoke["data"]["max_prompt_len"]
    data["sft"].update(max_steps=SFT_STEPS, checkpoint_every_steps=SFT_CHECKPOINT_EVERY)
    data["grpo"].update(
        max_steps=GRPO_STEPS, checkpoint_every_steps=1, max_generation_tokens=GENERATION_TOKENS
    )
    data["eval"]["max_generation_tokens"] = GENERATION_TOKENS
    for section, fields in changes.items():
        data[section] = {**data.get(section, {}), **fields}
    return data


def scaled(name: str, root: str, **changes: dict[str, Any]) -> Recipe:
    """The scaled recipe, validated like any other."""
    return parse_recipe(scaled_data(name, root, **changes), f"{name} (scaled to the tiny model)")


def full_run(name: str, root: str) -> Recipe:
    """The scaled recipe a trained recipe's full run takes (with its FULL_RUN_CHANGES)."""
    return scaled(name, root, **FULL_RUN_CHANGES.get(name, {}))


def evaluated_rows(recipe: Recipe) -> list[str]:
    """The report rows the recipe's evaluation gives (the base model adds its k-shot row)."""
    rows = list(recipe.eval.models)
    if "base" in rows and recipe.eval.base_shots:
        rows.insert(rows.index("base") + 1, f"base-{recipe.eval.base_shots}shot")
    return rows


def devices_needed(name: str) -> int:
    mesh = recipe_data(name)["mesh"]
    return int(mesh.get("fsdp", 1)) * int(mesh.get("tp", 1))


def _tiny_level(terms: int, size: int, tag: str | None = None) -> dict[str, Any]:
    args = {"min_terms": terms, "max_terms": terms, "min_digits": 1, "max_digits": 1}
    source = {"kind": "reasoning_gym", "name": "basic_arithmetic", "size": size, "args": args}
    return {**source, "reasoning": "steps", **({"tag": tag} if tag else {})}


def scaled_generalize(root: str) -> Recipe:
    """recipes/reinforce-generalize.yaml on the tiny model: its DAG, its node kinds and their
    settings (rewards, the random reward, logprobs mean, GRPO's throughput knobs, tags), with
    the smoke model, a ladder of 2 / 3 / 4 terms, a handful of rows and steps, and short
    generations. One edge differs: the preferences node reads the random-reward arm's GRPO
    samples, not the headroom evaluation's (whose samples all score alike on the tiny model,
    so they make no pair)."""
    data = copy.deepcopy(recipe_data("reinforce-generalize"))
    smoke = recipe_data("smoke")
    data["storage_root"] = root
    data["model"] = smoke["model"]
    data["data"].update(max_seq_len=PACKED_LEN, max_prompt_len=smoke["data"]["max_prompt_len"])
    data["data"]["eval"] = {
        "size": 12,
        "sources": [_tiny_level(4, 4, "k2"), _tiny_level(3, 4, "k1"), _tiny_level(2, 4, "le_k")],
    }
    data["data"]["validation"] = {"size": 8, "sources": [_tiny_level(3, 80)]}
    data["data"]["grpo"] = {"size": 8, "sources": [_tiny_level(3, 80)]}
    data["data"]["sft"] = {"size": 32, "sources": [_tiny_level(2, 200)]}
    data["sft"].update(max_steps=SFT_STEPS, checkpoint_every_steps=SFT_CHECKPOINT_EVERY)
    # saved at step 2 only: step 1, which the GRPO and DPO arms also save (Orbax's first
    # save), is off the grid, and validation's `steps: saved` must not score it
    small = {"max_steps": 2, "checkpoint_every_steps": 2}
    tokens = {"max_generation_tokens": GENERATION_TOKENS}
    data["grpo"].update(**small, **tokens)
    data["eval"].update(**tokens)
    for node in data["pipeline"]:
        config = node.get("config", {})
        if "max_steps" in config:
            config.update(small)
        if "max_generation_tokens" in config:
            config.update(tokens)
        if node["kind"] == "dpo":  # the few pairs of the tiny run fill a batch of 1
            config.update(max_response_len=GENERATION_TOKENS, batch_size=1)
        if node["kind"] == "self_teach":  # the tiny model is rarely right: keep any sample
            config.update(verify=["format_strict"], min_score=0.0)
        if node["kind"] == "preferences":
            # every headroom sample of the tiny model scores 0: pairs from the random-reward
            # arm's groups instead (rewards 0 or 1 by the draw), so the ORPO arm has pairs
            node["inputs"] = {"samples": "random"}
            config.pop("model", None)
    return parse_recipe(data, "reinforce-generalize (scaled to the tiny model)")
