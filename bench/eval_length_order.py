"""Greedy evaluation in length order against the split's own order: the same completions, and
the decode steps and seconds each order takes.

Why: Tunix's sampler decodes a batch until every row has ended, so a batch waits for its
longest completion. A prompt's length predicts its completion's, so evaluation batches
prompts of like length (generation.length_order; evaluate version 10). This decodes one
evaluate node's prompts through one of its run's checkpoints both ways, the orders in turns
(`--reps` rounds) in one process after a warm-up compile, and compares the completions.

A decode step count is each batch's longest completion in tokens (re-encoded, plus its end
token, at most the node's max_generation_tokens), summed over batches: the steps the sampler's
loop ran, up to the re-encoding.

    flock /tmp/far-heavy.lock env JAX_PLATFORMS=cpu .venv/bin/python -m bench.eval_length_order \
        --run /work/exp/runs/reinforce-generalize --node k2 --model grpo --prompts 256 \
        --out bench/results/eval-length-order.json

`--from-samples` decodes nothing: it counts the decode steps of every greedy evaluate node and
model of the run from the completions the run kept (samples.jsonl), in both orders (the
completions are the same in either; the test is tests/unit/test_generation_order.py):

    .venv/bin/python -m bench.eval_length_order --run /work/exp/runs/reinforce-generalize \
        --from-samples --out bench/results/eval-length-order-steps.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import reinforce_mode
from schemas.artifacts import CheckpointArtifact
from schemas.recipe import MeshSpec, ModelSpec
from schemas.recipe.evaluation import EvalConfig
from stages.modeling import generation, models
from stages.modeling.tokenizers import Tokenizer, build_tokenizer


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished run's directory")
    parser.add_argument("--node", default="k2", help="a greedy evaluate node of the run")
    parser.add_argument("--model", default="grpo", help="the checkpoint: a training node's id")
    parser.add_argument("--prompts", type=int, default=256, help="the node's first N prompts")
    parser.add_argument("--reps", type=int, default=1, help="timed rounds of both orders")
    parser.add_argument("--out", type=Path, help="also write the result here")
    parser.add_argument(
        "--from-samples", action="store_true", help="count the kept completions' decode steps"
    )
    parser.add_argument(
        "--cache-dir", default=os.environ.get("FAR_CACHE_DIR", os.path.expanduser("~/.cache/far"))
    )
    return parser.parse_args()


def node_prompts(run: Path, tag: str | None, count: int) -> list[str]:
    """The data_prep eval split's prompts with `tag`, in the split's order."""
    path = next(run.glob("data_prep-*/eval_prompts.jsonl"))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r["prompt"] for r in rows if tag is None or r.get("tag") == tag][:count]


def decode_steps(tokenizer: Tokenizer, completions: Sequence[str], batch: int, cap: int) -> int:
    """Each batch's longest completion in tokens, plus its end token, at most `cap`: summed."""
    lengths = [min(len(tokenizer.encode(c)) + 1, cap) for c in completions]
    return sum(max(lengths[i : i + batch]) for i in range(0, len(lengths), batch))


def steps_from_samples(run: Path, cache_dir: str) -> dict[str, Any]:
    """Per greedy evaluate node and model: the decode steps of its kept completions in the
    split's order and in length order, and their ratio."""
    nodes = reinforce_mode.records(run)
    out: dict[str, Any] = {}
    prompt_of = {r["id"]: r["prompt"] for r in _split_rows(run)}  # read once for every node
    for node, record in sorted(nodes.items()):
        eval_config = record["config"].get("eval") if record["stage"] == "evaluate" else None
        if eval_config is None or eval_config.get("temperature"):
            continue
        config = EvalConfig.model_validate(eval_config)
        tokenizer = build_tokenizer(ModelSpec.model_validate(record["config"]["model"]), cache_dir)
        by_model: dict[str, list[str]] = {}
        prompts: dict[str, list[str]] = {}
        for line in Path(record["_dir"], "samples.jsonl").read_text().splitlines():
            row = json.loads(line)
            by_model.setdefault(row["model"], []).append(row["completion"])
            prompts.setdefault(row["model"], []).append(prompt_of[row["id"]])
        counts = {}
        for model, completions in by_model.items():
            order = generation.length_order(tokenizer, prompts[model])
            cap, batch = config.max_generation_tokens, config.batch_size
            given = decode_steps(tokenizer, completions, batch, cap)
            length = decode_steps(tokenizer, [completions[i] for i in order], batch, cap)
            counts[model] = {"given": given, "length": length, "ratio": round(given / length, 3)}
        given = sum(c["given"] for c in counts.values())
        length = sum(c["length"] for c in counts.values())
        out[node] = {"models": counts, "ratio": round(given / length, 3)}
    return out


def _split_rows(run: Path) -> list[dict[str, Any]]:
    """The data_prep eval split's rows (held-out and validation prompts alike)."""
    rows = []
    for name in ("eval_prompts.jsonl", "validation_prompts.jsonl"):
        for path in run.glob(f"data_prep-*/{name}"):
            rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def main() -> None:
    args = arguments()
    if args.from_samples:
        counted = {"run": args.run.name, "nodes": steps_from_samples(args.run, args.cache_dir)}
        print(json.dumps(counted))
        if args.out:
            args.out.write_text(json.dumps(counted, indent=1) + "\n")
        return
    nodes = reinforce_mode.records(args.run)
    config = EvalConfig.model_validate(nodes[args.node]["config"]["eval"])
    if config.temperature:
        raise SystemExit(f"{args.node} samples (temperature {config.temperature}): not greedy")
    spec = ModelSpec.model_validate(nodes[args.node]["config"]["model"])
    recipe = json.loads((args.run / "run.json").read_text())["recipe"]
    prompt_len = int(recipe["data"]["max_prompt_len"])
    prompts = node_prompts(args.run, config.tag, args.prompts)
    tokenizer = build_tokenizer(spec, args.cache_dir)
    mesh = models.build_mesh(MeshSpec.model_validate(recipe["mesh"]))
    artifact = CheckpointArtifact.model_validate(nodes[args.model]["output"])
    network = models.policy_network(artifact, mesh, args.cache_dir, None)
    sampler = generation.build_sampler(
        network, tokenizer, spec, prompt_len, config.max_generation_tokens
    )

    def decode(some: list[str], by_length: bool) -> list[str]:
        return generation.generate(
            sampler,
            tokenizer,
            some,
            prompt_len=prompt_len,
            max_tokens=config.max_generation_tokens,
            batch_size=config.batch_size,
            temperature=0.0,
            seed=config.seed,
            by_length=by_length,
        )

    seconds = {"given": 0.0, "length": 0.0}
    outputs: dict[str, list[str]] = {}
    with mesh:
        decode(prompts[: config.batch_size], False)  # warm-up compile: one shape for both
        for _ in range(args.reps):
            for order in seconds:
                started = time.perf_counter()
                outputs[order] = decode(prompts, order == "length")
                seconds[order] += time.perf_counter() - started
    steps = {
        order: decode_steps(
            tokenizer,
            [outputs[order][i] for i in _order(tokenizer, prompts, order)],
            config.batch_size,
            config.max_generation_tokens,
        )
        for order in seconds
    }
    result: dict[str, Any] = {
        "run": args.run.name,
        "node": args.node,
        "model": args.model,
        "prompts": len(prompts),
        "batch_size": config.batch_size,
        "max_generation_tokens": config.max_generation_tokens,
        "reps": args.reps,
        "load_average": os.getloadavg(),
        "identical": outputs["given"] == outputs["length"],
        "decode_steps": steps,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "decode_steps_ratio": round(steps["given"] / steps["length"], 3),
        "seconds_ratio": round(seconds["given"] / seconds["length"], 3),
    }
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


def _order(tokenizer: Tokenizer, prompts: Sequence[str], order: str) -> list[int]:
    """The prompts' indices in the order their batches were made."""
    if order == "length":
        return generation.length_order(tokenizer, prompts)
    return list(range(len(prompts)))


if __name__ == "__main__":
    main()
