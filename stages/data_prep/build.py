"""The data_prep stage, building a dataset: sources -> cleaned, de-duplicated examples -> mixed
splits -> chat prompts with a reasoning-and-answer target in the recipe's prompt format
(`data.prompt`: by default Gemma turns and <reasoning>/<answer> tags) -> fixed-shape (optionally
packed) token arrays, prompt sets with answers and tests for GRPO and evaluation, and a data
card. The dataset artifact records the prompt format, so the stages after it grade by it.

Entry point: `prepare(config, model, ctx) -> StageOutcome[DatasetArtifact]`.

Splits are drawn eval, then grpo, then sft; an example id taken by one split is never drawn by
a later one, so train and eval are held apart even when they share a source. Every row that
is not used for a reason (undecodable, missing or mistyped field, empty, unparseable answer,
duplicate, too long) is written to quarantine.jsonl with that reason and counted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
from tqdm import tqdm

from schemas.artifacts import Artifact, DataCard, DatasetArtifact
from schemas.recipe import DataPrepConfig, ModelSpec, PromptFormat, SourceSpec, SplitSpec
from stages.core import storage
from stages.core.datasets import SPLIT_FILES, sft_npz_bytes
from stages.core.errors import InputError
from stages.core.identity import SOURCE_PREFIX
from stages.core.runner import RunContext, StageIdentity, StageOutcome, run_stage
from stages.data_prep.adapters import BadRow, Example, MappedExample
from stages.data_prep.columns import OWN_COLUMNS, row_reader
from stages.data_prep.fingerprints import source_fingerprint
from stages.data_prep.packing import pack_rows, useful_fraction
from stages.data_prep.sources import read_rows, source_label
from stages.modeling.tokenizers import Tokenizer, apply_chat_template, build_tokenizer
from stages.registry import hashed_config
from stages.rewards.answers import END_OF_TURN, INSTRUCTIONS, render_answer

log = logging.getLogger(__name__)
STAGE_VERSION = 2
INSTRUCTION = INSTRUCTIONS["tags"]  # the default prompt format's instruction
DEFAULT_PROMPT = PromptFormat()
# (split, config field, seed number), in draw order. The seed number is the split's own and
# not its place: the optional validation split, drawn second, leaves the others' draws as
# they were without it.
SPLITS = (
    ("eval", "eval", 0),
    ("validation", "validation", 3),
    ("grpo_train", "grpo", 1),
    ("sft_train", "sft", 2),
)
PROMPT_SPLITS = ("grpo_train", "eval", "validation")  # the splits written as prompt rows
HELD_OUT = ("eval", "validation")  # the splits a training split must not copy
TRAINING = ("grpo_train", "sft_train")
NEAR_DUPLICATE = "near-duplicate of a held-out prompt"  # the quarantine reason of a dropped one


def split_specs(config: DataPrepConfig) -> list[tuple[str, SplitSpec, int]]:
    """(split, its spec, its seed number) for each split the config draws, in draw order."""
    specs = [(split, getattr(config, attr), number) for split, attr, number in SPLITS]
    return [(split, spec, number) for split, spec, number in specs if spec is not None]


def _messages(question: str, prompt: PromptFormat, system: str = "") -> list[dict[str, str]]:
    """The conversation up to the question: the system text (the recipe's system prompt, then
    the row's own system turns; none: no system message), then the user turn holding FAR's
    instruction and the question."""
    instruction = prompt.instruction or INSTRUCTIONS[prompt.answer_format]
    text = "\n\n".join(part for part in (prompt.system, system) if part)
    head = [{"role": "system", "content": text}] if text else []
    return [*head, {"role": "user", "content": f"{instruction}\n{question}"}]


def chat_prompt(
    question: str,
    prompt: PromptFormat = DEFAULT_PROMPT,
    tokenizer: Tokenizer | None = None,
    system: str = "",
) -> str:
    """The user turn holding the instruction and question, opening the model's turn: Gemma's
    markup (a system text opens the user turn, as Gemma's own template puts it), or the
    tokenizer's chat template (`tokenizer` is then required). `system`: a chat row's own
    system turns, after the recipe's system prompt and before the instruction."""
    if prompt.template == "tokenizer":
        messages = _messages(question, prompt, system)
        return apply_chat_template(_templating(tokenizer), messages, True)
    user = "\n\n".join(m["content"] for m in _messages(question, prompt, system))
    return f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"


def format_target(
    reasoning: str,
    answer: str,
    prompt: PromptFormat = DEFAULT_PROMPT,
    tokenizer: Tokenizer | None = None,
    question: str = "",
    system: str = "",
) -> str:
    """The SFT target in the prompt's answer format, closing the model's turn; a row without
    reasoning gets the prompt's `filler` when it sets one (see `resolved_prompt`). With the
    tokenizer's template the turn closes as the template closes it after `question`'s prompt."""
    body = render_answer(reasoning or prompt.filler or "", answer, prompt.answer_format)
    if prompt.template == "gemma":
        return body + END_OF_TURN
    tokenizer = _templating(tokenizer)
    messages = _messages(question, prompt, system)
    opened = apply_chat_template(tokenizer, messages, True)
    whole = apply_chat_template(
        tokenizer, [*messages, {"role": "assistant", "content": body}], False
    )
    if not whole.startswith(opened) or body not in whole[len(opened) :]:
        raise InputError(
            f"data.prompt.template: 'tokenizer': the chat template of {tokenizer.name!r} does "
            f"not render a conversation as its prompt followed by the answer (it rewrites "
            f"earlier turns, or drops the answer's text); expected template: gemma, or a "
            f"model whose template appends each turn"
        )
    return whole[len(opened) :]


def _templating(tokenizer: Tokenizer | None) -> Tokenizer:
    if tokenizer is None:
        raise ValueError("template: tokenizer renders with the tokenizer, and none was given")
    return tokenizer


class Quarantine:
    """Every row kept out of the dataset, with its reason."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, source: str, reason: str, **where: Any) -> None:
        self.rows.append({"source": source, "reason": reason, **where})

    def by_reason(self) -> dict[str, int]:
        """Counts per reason kind (the text before any ':' detail)."""
        return dict(Counter(_NUMBER.sub("N", r["reason"].split(":")[0]) for r in self.rows))


# A standalone count or position ("line 3", "row 12"), not digits inside a name ("gsm8k",
# "UTF-8", "file-2.jsonl"): reason kinds group by the words around it.
_NUMBER = re.compile(r"(?<![\w.\-/])\d+(?![\w.\-/])")
_SOFT_PUNCTUATION = re.compile(r"[.,;:!?'\"`“”‘’]")


def normalized_key(text: str) -> str:
    """Case, spacing and sentence punctuation removed; math symbols (+ - * / =) kept."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(_SOFT_PUNCTUATION.sub(" ", folded).split())


class Deduper:
    """Exact (same prompt text) and normalized (case, spacing, punctuation) duplicates."""

    def __init__(self) -> None:
        self.exact: dict[str, str] = {}
        self.normalized: dict[str, str] = {}

    def duplicate_of(self, example: Example) -> str | None:
        text = whole_prompt(example)
        key = normalized_key(text)
        if text in self.exact:
            return f"duplicate (exact) of {self.exact[text]}"
        if key in self.normalized:
            return f"duplicate (normalized) of {self.normalized[key]}"
        self.exact[text] = self.normalized[key] = example.id
        return None


# a near-duplicate key's tokens: runs of letters or digits, and each math operator
_NEAR_TOKEN = re.compile(r"[^\W_]+|[-+*/=^<>%×÷]")


def near_key(text: str) -> str:
    """`text` with case, spacing and punctuation set aside: its words, numbers and math
    operators, casefolded, one space apart ("What is 3+4?" and "what is 3 + 4" are equal;
    "3 + 4" and "3 - 4", or "12" and "1 2", are not)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(_NEAR_TOKEN.findall(folded))


def held_out_keys(splits: Mapping[str, list[Example]]) -> dict[str, str]:
    """{near key: the id of the held-out example with it} of the eval and validation splits."""
    keys: dict[str, str] = {}
    for split in HELD_OUT:
        for example in splits.get(split, []):
            keys.setdefault(near_key(example.prompt), example.id)
    return keys


def near_duplicates(splits: Mapping[str, list[Example]]) -> dict[str, int]:
    """{training split: its examples that are near-duplicates of a held-out prompt}."""
    keys = held_out_keys(splits)
    return {
        split: sum(near_key(e.prompt) in keys for e in splits[split])
        for split in TRAINING
        if split in splits
    }


def whole_prompt(example: Example) -> str:
    """The example's prompt with a chat row's own system turns before it."""
    return f"{example.system}\n\n{example.prompt}" if example.system else example.prompt


def load_source(
    spec: SourceSpec, seed: int, quarantine: Quarantine, dedupe: Deduper
) -> list[Example]:
    """All usable examples of one source; an error if it has no rows or only bad ones."""
    label, adapter = source_label(spec), row_reader(spec)
    examples, total = [], 0
    for index, row in enumerate(
        tqdm(
            read_rows(spec, seed),
            desc=f"data_prep {label}",
            unit=" rows",
            leave=False,
            mininterval=2,
            disable=None,  # a terminal only: off one, tqdm's fragments ran into the log lines
        )
    ):
        total += 1
        try:
            if isinstance(row, BadRow):
                raise row
            example = adapter(row, label)
            if isinstance(row, dict) and row.get(OWN_COLUMNS):  # a mapped source's own columns
                example = MappedExample.of(example, row[OWN_COLUMNS])
        except BadRow as bad:
            quarantine.add(label, str(bad), index=index)
            continue
        if spec.domain is not None:
            example = dataclasses.replace(example, domain=spec.domain)
        if spec.tag is not None:
            example = dataclasses.replace(example, tag=spec.tag)
        duplicate = dedupe.duplicate_of(example)
        if duplicate:
            quarantine.add(label, duplicate, index=index, id=example.id)
            continue
        examples.append(example)
    if not examples:
        raise InputError(_no_usable_rows(spec, label, total, quarantine))
    return examples


def _no_usable_rows(spec: SourceSpec, label: str, total: int, quarantine: Quarantine) -> str:
    where = spec.name if spec.kind == "file" else label
    mine = [r for r in quarantine.rows if r["source"] == label]
    if not mine:
        return f"data source {where} ({label}) yielded no rows; expected at least one"
    first = mine[0]
    return (
        f"data source {where} ({label}): none of its {total} rows is usable; "
        f"row {first.get('index')}: {first['reason']}"
        + (f" (and {len(mine) - 1} more)" if len(mine) > 1 else "")
    )


def _source_key(spec: SourceSpec) -> str:
    return spec.model_dump_json()


def sft_sequence(
    example: Example, tokenizer: Tokenizer, prompt: PromptFormat = DEFAULT_PROMPT
) -> tuple[list[int], list[int]]:
    """(tokens, loss mask): BOS and prompt 0, target and EOS 1."""
    text = chat_prompt(example.prompt, prompt, tokenizer, example.system)
    head = [tokenizer.bos_id(), *tokenizer.encode(text)]
    target = format_target(
        example.reasoning, example.answer, prompt, tokenizer, example.prompt, example.system
    )
    response = [*tokenizer.encode(target), tokenizer.eos_id()]
    return head + response, [0] * len(head) + [1] * len(response)


def tokenize_on_grain(
    examples: list[Example], tokenizer: Tokenizer, prompt: PromptFormat = DEFAULT_PROMPT
) -> list[tuple[list[int], list[int]]]:
    """(tokens, loss mask) per example, as a grain map over the examples (order kept). grain
    is imported here: it imports JAX, which `far validate`'s reading of the SFT targets (and
    a complete run's re-run) must not pay for."""
    import grain

    dataset = grain.MapDataset.source(examples).map(lambda e: sft_sequence(e, tokenizer, prompt))
    return [dataset[i] for i in range(len(dataset))]


def fits(example: Example, split: str, tokenizer: Tokenizer, config: DataPrepConfig) -> str | None:
    """None if the example fits the split's shapes, else the quarantine reason."""
    if split == "sft_train":
        length = len(sft_sequence(example, tokenizer, config.prompt)[0])
        limit, what = config.max_seq_len, "max_seq_len"
    else:
        text = chat_prompt(example.prompt, config.prompt, tokenizer, example.system)
        length = len(tokenizer.encode(text)) + 1  # + BOS
        limit, what = config.max_prompt_len, "max_prompt_len"
    return f"oversize: {length} tokens > {what} {limit}" if length > limit else None


def quotas(mix: dict[str, float], size: int) -> dict[str, int]:
    """Whole counts per domain summing to `size` (largest remainder)."""
    raw = {d: p * size for d, p in mix.items()}
    counts = {d: int(v) for d, v in raw.items()}
    for d in sorted(raw, key=lambda d: (counts[d] - raw[d], d))[: size - sum(counts.values())]:
        counts[d] += 1
    return counts


def select(candidates: list[Example], spec: SplitSpec, rng: np.random.Generator) -> list[Example]:
    """A seeded shuffle, then the first `size`, or per-domain quotas when a mix is given."""
    shuffled = [candidates[i] for i in rng.permutation(len(candidates))]
    if spec.mix is None:
        return shuffled[: spec.size]
    wanted = quotas({str(d): p for d, p in spec.mix.items()}, spec.size)
    taken: Counter[str] = Counter()
    chosen = []
    for example in shuffled:
        if taken[example.domain] < wanted.get(example.domain, 0):
            taken[example.domain] += 1
            chosen.append(example)
    short = {d: n - taken[d] for d, n in wanted.items() if taken[d] < n}
    if short:
        log.warning("mix shortfall (domain: missing examples): %s", short)
    return chosen


def resolved_prompt(prompt: PromptFormat, sft_examples: list[Example]) -> PromptFormat:
    """The prompt format the dataset is written in, given the rows of its sft sources.

    No reasoning is ever invented: under tags, sft rows that all lack reasoning (answer-only
    data) are written in the answer format (`<answer>42</answer>`), which format_strict grades
    as 1.0; with a `filler`, or in the answer format, every row is written as it is. Rows
    with and without reasoning mixed, or answer-only rows under hashes or boxed (whose format
    rewards want reasoning before the answer), are an InputError naming the fix."""
    if prompt.filler is not None or prompt.answer_format == "answer":
        return prompt
    bare = [e for e in sft_examples if not e.reasoning]
    if not bare:
        return prompt
    if len(bare) == len(sft_examples) and prompt.answer_format == "tags":
        return prompt.model_copy(update={"answer_format": "answer"})
    what = (
        f"{len(bare)} of the {len(sft_examples)} rows of the sft sources have no reasoning "
        f"(first: {bare[0].id}, {bare[0].prompt[:60]!r})"
    )
    raise InputError(
        f"data.prompt: {what}, and answer_format {prompt.answer_format} trains reasoning before "
        f"the answer; expected answer_format: answer (train on the answers alone), "
        f"data.prompt.filler: '<a sentence>' (written as those rows' reasoning), or sources "
        f"whose rows all have reasoning"
    )


def build_splits(
    config: DataPrepConfig, tokenizer: Tokenizer, quarantine: Quarantine
) -> dict[str, list[Example]]:
    """The splits of `draw_splits`."""
    return draw_splits(config, tokenizer, quarantine)[0]


def load_pools(
    config: DataPrepConfig, quarantine: Quarantine, dedupe: Deduper | None = None
) -> dict[str, list[Example]]:
    """Every distinct source's usable examples, loaded once, by source key."""
    dedupe, pools = dedupe or Deduper(), {}
    for _, spec, _ in split_specs(config):
        for source in spec.sources:
            if _source_key(source) not in pools:
                pools[_source_key(source)] = load_source(source, config.seed, quarantine, dedupe)
    return pools


def sft_pool(config: DataPrepConfig, pools: Mapping[str, list[Example]]) -> list[Example]:
    """The examples of the sources the sft split draws from."""
    return [e for source in config.sft.sources for e in pools[_source_key(source)]]


def draw_splits(
    config: DataPrepConfig, tokenizer: Tokenizer, quarantine: Quarantine
) -> tuple[dict[str, list[Example]], PromptFormat]:
    """Load every distinct source once, settle the prompt format on the sft sources' rows
    (`resolved_prompt`), then draw eval, grpo and sft in that order."""
    pools = load_pools(config, quarantine)
    prompt = resolved_prompt(config.prompt, sft_pool(config, pools))
    config = config.model_copy(update={"prompt": prompt})
    drawn = split_specs(config)
    taken: set[str] = set()
    splits: dict[str, list[Example]] = {}
    for split, spec, number in drawn:
        candidates = []
        held_out = held_out_keys(splits) if config.drop_near_duplicates else {}
        for source in spec.sources:
            for example in pools[_source_key(source)]:
                if example.id in taken:
                    continue
                reason = fits(example, split, tokenizer, config)
                copied = held_out.get(near_key(example.prompt)) if split in TRAINING else None
                if reason is None and copied is not None:
                    reason = f"{NEAR_DUPLICATE}: {copied}"
                if reason:
                    quarantine.add(example.source, reason, split=split, id=example.id)
                else:
                    candidates.append(example)
        splits[split] = select(candidates, spec, np.random.default_rng([config.seed, number]))
        if not splits[split]:
            raise InputError(
                f"split {split!r} is empty: no source example fits it (raise "
                f"data.max_seq_len / data.max_prompt_len, or add sources)"
            )
        taken |= {e.id for e in splits[split]}
    return splits, prompt


def prompt_row(
    example: Example, prompt: PromptFormat = DEFAULT_PROMPT, tokenizer: Tokenizer | None = None
) -> dict[str, Any]:
    return {
        "id": example.id,
        "source": example.source,
        "domain": example.domain,
        "prompt": chat_prompt(example.prompt, prompt, tokenizer, example.system),
        "answer": example.answer,
        "tests": list(example.tests),
        **({"tag": example.tag} if example.tag else {}),  # untagged rows as before
        # a mapped source's own columns, for a user's reward (none: the key is left out)
        **({"columns": example.columns} if isinstance(example, MappedExample) else {}),
    }


def prompt_rows(
    examples: list[Example], split: str, config: DataPrepConfig, tokenizer: Tokenizer
) -> list[dict[str, Any]]:
    """A prompt split's rows; with `data.gold_targets`, each grpo_train row also carries the
    SFT target its example gives (`target`, exactly as the sft split's are written)."""
    rows = [prompt_row(e, config.prompt, tokenizer) for e in examples]
    if not (config.gold_targets and split == "grpo_train"):
        return rows
    return [
        {
            **row,
            "target": format_target(
                e.reasoning, e.answer, config.prompt, tokenizer, e.prompt, e.system
            ),
        }
        for row, e in zip(rows, examples, strict=True)
    ]


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()


def data_card(
    config: DataPrepConfig,
    splits: dict[str, list[Example]],
    lengths: list[int],
    arrays: dict[str, np.ndarray],
    quarantine: Quarantine,
) -> DataCard:
    width = max(1, config.max_seq_len // 8)
    bins = Counter((n // width) * width for n in lengths)
    histogram = {f"{low}-{low + width - 1}": bins[low] for low in sorted(bins)}
    domains = {s: Counter(e.domain for e in ex) for s, ex in splits.items()}
    return DataCard(
        counts_by_source={s: dict(Counter(e.source for e in ex)) for s, ex in splits.items()},
        counts_by_domain={s: dict(c) for s, c in domains.items()},
        target_mix={s: dict(spec.mix or {}) for s, spec, _ in split_specs(config)},
        achieved_mix={
            s: {d: n / sum(c.values()) for d, n in c.items()} for s, c in domains.items()
        },
        quarantined_by_reason=quarantine.by_reason(),
        sft_length_histogram=histogram,
        packed=config.packing,
        sft_rows=int(arrays["input_tokens"].shape[0]),
        useful_token_fraction=useful_fraction(arrays),
    )


def _build_splits_or_explain(
    directory: str, config: DataPrepConfig, tokenizer: Tokenizer, quarantine: Quarantine
) -> tuple[dict[str, list[Example]], PromptFormat]:
    """draw_splits; when the data cannot make the splits, quarantine.jsonl is still written
    (the reasons the error points to) and the error names it."""
    try:
        return draw_splits(config, tokenizer, quarantine)
    except InputError as e:
        if not quarantine.rows:  # the file itself was unreadable: no rows to point to
            raise
        uri = storage.join(directory, "quarantine.jsonl")
        storage.write_bytes(uri, _jsonl(quarantine.rows))
        raise InputError(f"{e}; every rejected row with its reason: {uri}") from e


def say_shortfalls(
    config: DataPrepConfig,
    splits: Mapping[str, list[Example]],
    quarantine: Quarantine,
    where: str,
) -> None:
    """One console line per split that came out short of its size, and one for the rows
    quarantined (their count, the commonest reasons and the file holding each one)."""
    for split, spec, _ in split_specs(config):
        if len(splits[split]) < spec.size:
            log.warning(
                "data_prep: split %s has %d of %d rows: its sources hold no more usable "
                "examples (add rows or sources, or lower its size)",
                split,
                len(splits[split]),
                spec.size,
            )
    if quarantine.rows:
        reasons = sorted(quarantine.by_reason().items(), key=lambda item: -item[1])
        shown = ", ".join(f"{reason}: {count}" for reason, count in reasons[:3])
        more = f", {len(reasons) - 3} more reasons" if len(reasons) > 3 else ""
        log.warning(
            "data_prep: %d rows quarantined (%s%s); each with its reason in %s",
            len(quarantine.rows),
            shown,
            more,
            where,
        )


def dropped_near_duplicates(quarantine: Quarantine) -> set[str]:
    """The ids of the examples kept out of a training split as near-duplicates."""
    return {r["id"] for r in quarantine.rows if r["reason"].startswith(NEAR_DUPLICATE)}


def say_near_duplicates(near: Mapping[str, int], quarantine: Quarantine) -> None:
    """One console line: the training examples that near-duplicate an eval or validation
    prompt (kept), or those dropped for it (data.drop_near_duplicates)."""
    dropped = len(dropped_near_duplicates(quarantine))
    if sum(near.values()):
        shown = ", ".join(f"{split}: {count}" for split, count in near.items() if count)
        log.warning(
            "data_prep: %d training examples are near-duplicates of held-out prompts (%s; the "
            "same text up to case, spacing and punctuation); set data.drop_near_duplicates: "
            "true to drop them",
            sum(near.values()),
            shown,
        )
    elif dropped:
        log.warning(
            "data_prep: %d training examples dropped as near-duplicates of held-out prompts "
            "(data.drop_near_duplicates; each in quarantine.jsonl)",
            dropped,
        )


def _write_dataset(
    directory: str, config: DataPrepConfig, model: ModelSpec, ctx: RunContext
) -> tuple[DatasetArtifact, dict[str, float], dict[str, list[float]]]:
    tokenizer = build_tokenizer(model, ctx.model_cache, ctx.shared)
    format_target(
        "", "", config.prompt, tokenizer
    )  # a template that cannot render: before any work
    quarantine = Quarantine()
    splits, prompt = _build_splits_or_explain(directory, config, tokenizer, quarantine)
    config = config.model_copy(update={"prompt": prompt})  # the format the data is written in
    sequences = tokenize_on_grain(splits["sft_train"], tokenizer, config.prompt)
    arrays = pack_rows(sequences, config.max_seq_len, tokenizer.pad_id(), config.packing)
    files = {
        SPLIT_FILES["sft_train"]: sft_npz_bytes(arrays),
        **{
            SPLIT_FILES[split]: _jsonl(prompt_rows(splits[split], split, config, tokenizer))
            for split in PROMPT_SPLITS
            if split in splits
        },
        "quarantine.jsonl": _jsonl(quarantine.rows),
    }
    say_shortfalls(config, splits, quarantine, storage.join(directory, "quarantine.jsonl"))
    near = near_duplicates(splits)
    say_near_duplicates(near, quarantine)
    digest = hashlib.sha256()
    for name in sorted(files):
        storage.write_bytes(storage.join(directory, name), files[name])
        digest.update(name.encode() + hashlib.sha256(files[name]).digest())
    card = data_card(config, splits, [len(t) for t, _ in sequences], arrays, quarantine)
    artifact = DatasetArtifact(
        uri=directory,
        tokenizer=tokenizer.name,
        seq_len=config.max_seq_len,
        prompt_len=config.max_prompt_len,
        split_sizes={s: len(ex) for s, ex in splits.items()},
        quarantined=len(quarantine.rows),
        card=card,
        fingerprint=digest.hexdigest(),
        prompt=config.prompt,
    )
    metrics = {
        "useful_token_fraction": card.useful_token_fraction,
        "quarantined": float(len(quarantine.rows)),
        "sft_rows": float(card.sft_rows),
        "near_duplicates": float(sum(near.values())),
        "near_duplicates_dropped": float(len(dropped_near_duplicates(quarantine))),
    }
    return artifact, metrics, {}


# The sft targets of rows without reasoning: revision 2 writes the answer alone (revision 1
# invented a fixed reasoning sentence). It is hashed only for recipes whose sft split reads a
# source that gives such rows by its layout, so only their data_prep identity moves.
ANSWER_ONLY_TARGETS = "answer-only targets r2"
_ANSWER_ONLY_ADAPTERS = ("mbpp", "humaneval", "ultrafeedback")


def _answer_only_source(spec: SourceSpec) -> bool:
    """Whether the source's layout gives rows without reasoning: a preset whose rows have
    none, or a column map that names no reasoning column."""
    if spec.row_adapter == "columns":
        return spec.columns is not None and spec.columns.reasoning is None
    return spec.row_adapter in _ANSWER_ONLY_ADAPTERS


# Where a chat row's own system turns go: revision 2 renders them first, before FAR's
# instruction (revision 1 put them after it, with the question). Hashed only for recipes with
# a conversational source (a column map naming `messages`), so only their identity moves.
CHAT_SYSTEM_FIRST = "chat system turns first r2"


def _chat_source(spec: SourceSpec) -> bool:
    return spec.columns is not None and spec.columns.messages is not None


def identity(config: DataPrepConfig, model: ModelSpec) -> StageIdentity:
    """The data depends on its config, the sources' content and the tokenizer (named by where
    it comes from) only."""
    tokenizer = {
        "tokenizer": model.tokenizer,
        "source": model.source,
        "uri": model.uri,
        "preset": model.preset,
    }
    hashed: dict[str, Any] = {"data": hashed_config("data_prep", config), "model": tokenizer}
    if any(_answer_only_source(spec) for spec in config.sft.sources):
        hashed["targets"] = ANSWER_ONLY_TARGETS
    specs = [spec for _, split_spec, _ in split_specs(config) for spec in split_spec.sources]
    if any(_chat_source(spec) for spec in specs):
        hashed["chat_system"] = CHAT_SYSTEM_FIRST
    sources = {}
    for _, split_spec, _ in split_specs(config):
        for spec in split_spec.sources:
            sources[f"{SOURCE_PREFIX}{spec.kind}:{spec.name}"] = source_fingerprint(spec)
    return StageIdentity("data_prep", STAGE_VERSION, hashed, dict(sorted(sources.items())))


def prepare(
    config: DataPrepConfig, model: ModelSpec, ctx: RunContext
) -> StageOutcome[DatasetArtifact]:
    """Prepare (or reuse, if already committed) the run's dataset."""
    return run_stage(
        ctx,
        identity(config, model),
        lambda directory: _write_dataset(directory, config, model, ctx),
    )


def run(
    inputs: Mapping[str, Artifact], config: DataPrepConfig, ctx: RunContext
) -> StageOutcome[DatasetArtifact]:
    """The registered entry point (stages/registry.py): no inputs; the recipe's model names
    the tokenizer."""
    return prepare(config, ctx.require_model(), ctx)
