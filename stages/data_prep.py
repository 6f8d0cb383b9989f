"""Data-prep stage: an offline source -> Gemma chat prompts with a reasoning/answer target ->
fixed-shape token arrays with a loss mask, plus prompt sets (with answers) for GRPO and eval.

Entry point: `prepare(config, model, ctx) -> StageOutcome[DatasetArtifact]`.

Splits are held apart by example id (a hash of the question text) and are deterministic for
a seed. Rows that cannot be used (too long for the configured shapes) are quarantined with
their reason, never dropped silently.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import reasoning_gym

from schemas.artifacts import DatasetArtifact
from schemas.recipe import DataPrepConfig, ModelSpec
from stages import storage
from stages.runner import RunContext, StageIdentity, StageOutcome, run_stage
from stages.tokenizers import Tokenizer, build_tokenizer

log = logging.getLogger(__name__)
STAGE_VERSION = 1
INSTRUCTION = (
    "Think step by step inside <reasoning> </reasoning>, "
    "then give only the final answer inside <answer> </answer>."
)
SPLIT_FILES = {
    "sft_train": "sft_train.npz",
    "grpo_train": "grpo_prompts.jsonl",
    "eval": "eval_prompts.jsonl",
}


@dataclass(frozen=True)
class Example:
    id: str
    source: str
    question: str
    reasoning: str
    answer: str


def chat_prompt(question: str) -> str:
    """A Gemma user turn holding the instruction and question, opening the model's turn."""
    return f"<start_of_turn>user\n{INSTRUCTION}\n{question}<end_of_turn>\n<start_of_turn>model\n"


def format_target(reasoning: str, answer: str) -> str:
    return f"<reasoning>{reasoning}</reasoning><answer>{answer}</answer><end_of_turn>"


def load_examples(config: DataPrepConfig) -> list[Example]:
    """Draw from a reasoning-gym generator, de-duplicated by question text."""
    wanted = config.sft_examples + config.grpo_prompts + config.eval_prompts
    try:
        items = reasoning_gym.create_dataset(
            config.generator, size=wanted * 2, seed=config.seed, **config.generator_args
        )
    except Exception as e:
        raise ValueError(
            f"reasoning-gym generator {config.generator!r} with args "
            f"{config.generator_args} could not be created: {e}"
        ) from e
    by_id: dict[str, Example] = {}
    for item in items:
        example = _from_reasoning_gym(config.generator, item)
        by_id.setdefault(example.id, example)
    if len(by_id) < wanted:
        raise ValueError(
            f"generator {config.generator!r} gave {len(by_id)} distinct questions, "
            f"need {wanted} (sft_examples + grpo_prompts + eval_prompts)"
        )
    return list(by_id.values())  # generator order (seeded), first occurrence of each id


def _from_reasoning_gym(generator: str, item: dict[str, Any]) -> Example:
    meta = item.get("metadata", {})
    if "answer_cot" in meta:  # gsm_symbolic: a worked solution ending in '#### N'
        reasoning = str(meta["answer_cot"]).split("####")[0].strip()
    elif "expression" in meta:  # basic_arithmetic and friends
        reasoning = f"{meta['expression']} = {item['answer']}"
    else:
        reasoning = ""
    question = str(item["question"])
    digest = hashlib.sha256(question.encode()).hexdigest()[:16]
    return Example(
        f"{generator}:{digest}",
        f"reasoning_gym/{generator}",
        question,
        reasoning,
        str(item["answer"]),
    )


def split_examples(examples: list[Example], config: DataPrepConfig) -> dict[str, list[Example]]:
    """Eval first, then GRPO, then SFT: ids are unique, so the splits are disjoint."""
    n_eval, n_grpo = config.eval_prompts, config.grpo_prompts
    return {
        "eval": examples[:n_eval],
        "grpo_train": examples[n_eval : n_eval + n_grpo],
        "sft_train": examples[n_eval + n_grpo : n_eval + n_grpo + config.sft_examples],
    }


def tokenize_sft(
    examples: list[Example], tokenizer: Tokenizer, seq_len: int
) -> tuple[dict[str, np.ndarray], list[dict[str, str]]]:
    """Fixed [N, seq_len] tokens and loss mask (prompt 0, response 1), plus quarantined rows."""
    rows, masks, quarantined = [], [], []
    for ex in examples:
        prompt = [tokenizer.bos_id(), *tokenizer.encode(chat_prompt(ex.question))]
        response = [*tokenizer.encode(format_target(ex.reasoning, ex.answer)), tokenizer.eos_id()]
        length = len(prompt) + len(response)
        if length > seq_len:
            quarantined.append({"id": ex.id, "reason": f"{length} tokens > max_seq_len {seq_len}"})
            continue
        pad = seq_len - length
        rows.append(prompt + response + [tokenizer.pad_id()] * pad)
        masks.append([0] * len(prompt) + [1] * len(response) + [0] * pad)
    arrays = {
        "input_tokens": np.asarray(rows, dtype=np.int32).reshape(-1, seq_len),
        "input_mask": np.asarray(masks, dtype=np.int32).reshape(-1, seq_len),
    }
    return arrays, quarantined


def prompt_rows(
    examples: list[Example], tokenizer: Tokenizer, prompt_len: int
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Prompt text with its answer (for rewards and metrics); too-long prompts quarantined."""
    kept, quarantined = [], []
    for ex in examples:
        prompt = chat_prompt(ex.question)
        length = len(tokenizer.encode(prompt)) + 1  # + BOS
        if length > prompt_len:
            quarantined.append({"id": ex.id, "reason": f"prompt {length} > {prompt_len} tokens"})
            continue
        kept.append({"id": ex.id, "source": ex.source, "prompt": prompt, "answer": ex.answer})
    return kept, quarantined


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stub types kwds as bool
    return buffer.getvalue()


def _jsonl(rows: list[dict[str, str]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()


def load_sft_arrays(artifact: DatasetArtifact) -> dict[str, np.ndarray]:
    data = storage.read_bytes(storage.join(artifact.uri, SPLIT_FILES["sft_train"]))
    with np.load(io.BytesIO(data)) as npz:
        return {k: npz[k] for k in npz.files}


def load_prompts(artifact: DatasetArtifact, split: str) -> list[dict[str, str]]:
    text = storage.read_text(storage.join(artifact.uri, SPLIT_FILES[split]))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _write_dataset(
    directory: str, config: DataPrepConfig, model: ModelSpec, cache_dir: str
) -> tuple[DatasetArtifact, dict[str, float]]:
    tokenizer = build_tokenizer(model, cache_dir)
    splits = split_examples(load_examples(config), config)
    sft_arrays, bad_sft = tokenize_sft(splits["sft_train"], tokenizer, config.max_seq_len)
    grpo_rows, bad_grpo = prompt_rows(splits["grpo_train"], tokenizer, config.max_prompt_len)
    eval_rows, bad_eval = prompt_rows(splits["eval"], tokenizer, config.max_prompt_len)
    quarantine = [
        {**q, "split": s}
        for s, qs in (("sft_train", bad_sft), ("grpo_train", bad_grpo), ("eval", bad_eval))
        for q in qs
    ]
    files = {
        SPLIT_FILES["sft_train"]: _npz_bytes(sft_arrays),
        SPLIT_FILES["grpo_train"]: _jsonl(grpo_rows),
        SPLIT_FILES["eval"]: _jsonl(eval_rows),
        "quarantine.jsonl": _jsonl(quarantine),
    }
    sizes = {
        "sft_train": len(sft_arrays["input_tokens"]),
        "grpo_train": len(grpo_rows),
        "eval": len(eval_rows),
    }
    for split, size in sizes.items():
        if size == 0:
            raise ValueError(
                f"split {split!r} is empty after quarantine; see quarantine.jsonl "
                f"reasons and raise max_seq_len/max_prompt_len"
            )
    digest = hashlib.sha256()
    for name in sorted(files):
        storage.write_bytes(storage.join(directory, name), files[name])
        digest.update(name.encode() + hashlib.sha256(files[name]).digest())
    used = sft_arrays["input_tokens"] != tokenizer.pad_id()
    artifact = DatasetArtifact(
        uri=directory,
        tokenizer=tokenizer.name,
        seq_len=config.max_seq_len,
        prompt_len=config.max_prompt_len,
        split_sizes=sizes,
        counts_by_source=dict(Counter(e.source for s in splits.values() for e in s)),
        quarantined=len(quarantine),
        fingerprint=digest.hexdigest(),
    )
    return artifact, {"useful_token_fraction": float(used.mean()), "quarantined": len(quarantine)}


def identity(config: DataPrepConfig, model: ModelSpec) -> StageIdentity:
    """The data depends on its config and the tokenizer (named by where it comes from) only."""
    tokenizer = {"tokenizer": model.tokenizer, "source": model.source, "uri": model.uri,
                 "preset": model.preset}  # fmt: skip
    hashed = {"data": config.model_dump(mode="json"), **tokenizer}
    return StageIdentity("data_prep", STAGE_VERSION, hashed, {})


def prepare(
    config: DataPrepConfig, model: ModelSpec, ctx: RunContext
) -> StageOutcome[DatasetArtifact]:
    """Prepare (or reuse, if already committed) the run's dataset."""
    return run_stage(
        ctx,
        identity(config, model),
        lambda directory: _write_dataset(directory, config, model, ctx.model_cache),
    )
