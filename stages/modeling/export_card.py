"""The model card (README.md) of an exported checkpoint: what it is and how it was made.

A hub shows README.md as the model's page and reads its YAML front matter (base_model,
library_name, tags, license) for search and lineage. The rest comes from the run's own records,
so the card says what storage says: the recipe (its name and a digest of it as run.json holds
it), the data sources, each stage that led to the checkpoint with its record digest, the
evaluations written about this checkpoint, and the run's ledger root, which `far audit
--expect-root` checks the whole chain against. The prompt format the run trained with (system
prompt, instruction, answer format, chat template) comes from its data_prep record, and the
usage example prompts with the run's first eval prompt, exactly as FAR rendered it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from schemas.artifacts import DatasetArtifact
from schemas.recipe import EvalConfig, ModelSpec, PromptFormat
from schemas.record import StageRecord
from stages.core import ledger, storage
from stages.core.evaluations import read_evaluations
from stages.core.records import (
    find_checkpoint_record,
    located_output,
    record_directory,
    record_run,
    resolve,
)
from stages.modeling import families
from stages.rewards.answers import INSTRUCTIONS

# the Hugging Face repository each preset's packaged weights were converted from
HUB_BASES = {"gemma3_270m": "google/gemma-3-270m"}
_EVAL_COLUMNS = ("accuracy", "format_rate", "pass@1", "num_prompts")
# the eval split's prompt rows in a dataset (stages.core.datasets.SPLIT_FILES, which imports
# JAX through grain: the card is written without it)
EVAL_PROMPTS = "eval_prompts.jsonl"


@dataclass
class CardFacts:
    """What the card says, gathered from the run's storage."""

    spec: ModelSpec
    stage: str
    checkpoint_uri: str
    step: int
    recipe: dict[str, Any] | None
    run_uri: str
    stages: list[tuple[str, StageRecord]] = field(default_factory=list)  # (record uri, record)
    evaluations: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    ledger_root: str | None = None
    ledger_sha256: dict[str, str] = field(default_factory=dict)  # run-relative path -> sha256
    prompt: PromptFormat | None = None  # the format the run's data was written in
    example_prompt: str | None = None  # the first eval prompt, as FAR rendered it


def gather(checkpoint_uri: str) -> CardFacts:
    """The facts of the checkpoint at `checkpoint_uri` and of the run it belongs to."""
    record_uri, record = find_checkpoint_record(checkpoint_uri)
    output = record.output
    run_uri = record_run(record_uri)
    manifest = storage.join(run_uri, "run.json")
    facts = CardFacts(
        spec=output.model,  # type: ignore[union-attr]
        stage=record.node or record.stage,
        checkpoint_uri=checkpoint_uri,
        step=output.step,  # type: ignore[union-attr]
        recipe=storage.read_json(manifest)["recipe"] if storage.exists(manifest) else None,
        run_uri=run_uri,
        ledger_root=ledger.root(run_uri),
    )
    facts.stages = upstream(record_uri, record)
    facts.evaluations = [
        (e.evaluation.rstrip("/").rsplit("/", 1)[-1], e.scores)
        for _, e in read_evaluations(record_directory(record_uri))
    ]
    facts.ledger_sha256 = {e.path: e.sha256 for e in ledger.read(run_uri)}
    facts.prompt, facts.example_prompt = prompt_facts(facts.stages)
    return facts


def prompt_facts(stages: list[tuple[str, StageRecord]]) -> tuple[PromptFormat | None, str | None]:
    """The prompt format of the dataset the checkpoint was trained on, and that dataset's
    first eval prompt (None: no data_prep record upstream, or no eval row)."""
    for uri, rec in stages:
        if rec.stage == "data_prep" and isinstance(rec.output, DatasetArtifact):
            dataset = located_output(uri, rec)
            rows = storage.join(dataset.uri, EVAL_PROMPTS)
            first = None
            if storage.exists(rows):
                line = next((x for x in storage.read_text(rows).splitlines() if x.strip()), "")
                first = json.loads(line).get("prompt") if line else None
            return rec.output.prompt, first
    return None, None


def upstream(record_uri: str, record: StageRecord) -> list[tuple[str, StageRecord]]:
    """The record and its inputs' records, recursively, each once, upstream first."""
    seen: dict[str, StageRecord] = {}

    def visit(uri: str, rec: StageRecord) -> None:
        for ref in rec.input_artifacts.values():
            if ref.record_uri is not None:
                upstream = resolve(uri, rec, ref.record_uri)
                if upstream not in seen:
                    visit(upstream, StageRecord.model_validate(storage.read_json(upstream)))
        seen.setdefault(uri, rec)

    visit(record_uri, record)
    return list(seen.items())


def eval_max_new_tokens(facts: CardFacts) -> int:
    """The run's evaluation budget of new tokens (EvalConfig's default without a recipe)."""
    default = EvalConfig().max_generation_tokens
    evaluation = (facts.recipe or {}).get("eval") or {}
    return int(evaluation.get("max_generation_tokens") or default)


def recipe_digest(recipe: dict[str, Any]) -> str:
    """sha256 of the recipe's canonical JSON, as run.json holds it."""
    canonical = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    return storage.sha256_bytes(canonical.encode())


def base_model(spec: ModelSpec) -> str | None:
    """The hub repository the weights started from, when there is one."""
    if spec.source == "hub":
        return spec.uri
    if spec.source == "gguf" and spec.uri is None and spec.preset is not None:
        return HUB_BASES.get(spec.preset)
    return None


def front_matter(facts: CardFacts, adapter: bool) -> str:
    spec = facts.spec
    lines = ["---"]
    base = base_model(spec)
    if base:
        lines.append(f"base_model: {base}")
    lines.append(f"library_name: {'peft' if adapter else 'transformers'}")
    terms = families.get(spec.family).license  # the terms the base weights come under
    if terms is not None and spec.source != "random":
        lines.append(f"license: {terms}")
    lines.append("pipeline_tag: text-generation")
    tags = ["far", spec.family, facts.stage, "lora" if adapter else "merged"]
    lines.append("tags:")
    lines += [f"- {tag}" for tag in tags]
    lines.append("---")
    return "\n".join(lines)


def _data_lines(recipe: dict[str, Any] | None) -> list[str]:
    if recipe is None:
        return ["The run has no run.json: its data sources are not known here."]
    lines = []
    for split, spec in sorted((recipe.get("data") or {}).items()):
        if isinstance(spec, dict) and spec.get("sources"):
            names = ", ".join(
                f"{s.get('kind')}:{s.get('name')}"
                + (f" ({s['config']})" if s.get("config") else "")
                for s in spec["sources"]
            )
            lines.append(f"- {split} ({spec.get('size')} rows): {names}")
    return lines


def _stage_table(facts: CardFacts) -> list[str]:
    run_uri = facts.run_uri
    lines = ["| stage | directory | record digest | ledger sha256 |", "| --- | --- | --- | --- |"]
    for uri, rec in facts.stages:
        relative = uri[len(run_uri) + 1 :] if uri.startswith(run_uri + "/") else uri
        directory = relative.rsplit("/", 1)[0]
        sha = facts.ledger_sha256.get(relative, "not in the ledger")
        lines.append(f"| {rec.node or rec.stage} | {directory} | {rec.digest} | {sha} |")
    return lines


def _eval_table(facts: CardFacts) -> list[str]:
    if not facts.evaluations:
        return ["No evaluation of this checkpoint is recorded (run an evaluate stage)."]
    header = ["evaluation", *_EVAL_COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for name, scores in facts.evaluations:
        metrics = {**scores.get("metrics", {}), **scores}
        cells = [_cell(metrics.get(column)) for column in _EVAL_COLUMNS]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return lines


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "" if value is None else str(value)


def model_card(facts: CardFacts, adapter: bool) -> str:
    """README.md for the export of `facts`' checkpoint (merged weights, or a peft adapter)."""
    recipe = facts.recipe
    name = recipe.get("name", "?") if recipe else "unknown"
    digest = recipe_digest(recipe) if recipe else "unknown (no run.json)"
    sections = [
        front_matter(facts, adapter),
        f"# {name}: {facts.stage} (step {facts.step})",
        f"Post-trained with FAR (Format-Align-Reinforce) from `{_source(facts.spec)}`: "
        + ("a LoRA adapter for peft." if adapter else "the weights with any LoRA merged in."),
        f"## Recipe\n\n- name: `{name}`\n- digest (run.json's recipe, canonical JSON): "
        f"`{digest}`\n- checkpoint: `{facts.checkpoint_uri}` (step {facts.step})",
        "## Data\n\n" + "\n".join(_data_lines(recipe)),
        "## Prompt format\n\n" + _prompt_lines(facts.prompt),
        "## Stages\n\nThe records behind this checkpoint, upstream first:\n\n"
        + "\n".join(_stage_table(facts)),
        "## Evaluation\n\n" + "\n".join(_eval_table(facts)),
        "## Lineage\n\n"
        f"Ledger root at export: `{facts.ledger_root}`. `far audit RUN --expect-root ROOT` "
        "checks every record above against it.",
        "## Use\n\n" + _usage(adapter, facts.example_prompt),
    ]
    return "\n\n".join(sections) + "\n"


def _source(spec: ModelSpec) -> str:
    base = base_model(spec)
    what = spec.preset or "a random-init test model"
    return f"{base} ({spec.source}, {what})" if base else f"{spec.source}: {spec.uri or what}"


def _prompt_lines(prompt: PromptFormat | None) -> str:
    """The prompt format the model was trained with, each part as the data was written."""
    if prompt is None:
        return "No data_prep record is upstream of this checkpoint: its prompt format is not known."
    instruction = prompt.instruction or INSTRUCTIONS[prompt.answer_format]
    template = (
        "Gemma turns (`<start_of_turn>user ... <end_of_turn>`; the system prompt opens the "
        "user turn)"
        if prompt.template == "gemma"
        else "the tokenizer's own chat template"
    )
    lines = [
        f"- system prompt: {_quoted(prompt.system) if prompt.system else 'none'}",
        f"- instruction (before each question, on its own line): {_quoted(instruction)}",
        f"- answer format: `{prompt.answer_format}`",
        f"- chat template: `{prompt.template}`, {template}",
    ]
    if prompt.filler:
        lines.append(f"- reasoning written for rows without any: {_quoted(prompt.filler)}")
    return "\n".join(lines)


def _quoted(text: str) -> str:
    return "`" + text.replace("`", "'") + "`" if "\n" not in text else json.dumps(text)


def _usage(adapter: bool, example_prompt: str | None) -> str:
    load = (
        "from peft import PeftModel\n"
        "base = AutoModelForCausalLM.from_pretrained('EXPORT/base')  # or the base_model repo\n"
        "model = PeftModel.from_pretrained(base, 'EXPORT')\n"
        if adapter
        else "model = AutoModelForCausalLM.from_pretrained('EXPORT')\n"
    )
    if example_prompt is None:
        return (
            "This run's data has no eval prompt to show; prompt the model as the prompt "
            "format above says."
        )
    return (
        "The prompt is the run's first eval prompt, exactly as FAR rendered it (chat markup, "
        "system prompt and instruction included); a prompt of your own takes the same form.\n\n"
        "```python\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "tokenizer = AutoTokenizer.from_pretrained('EXPORT')\n"
        f"{load}"
        f"prompt = {json.dumps(example_prompt, ensure_ascii=False)}\n"
        "ids = tokenizer(prompt, return_tensors='pt')  # <bos> first, as FAR encodes a prompt\n"
        "out = model.generate(**ids)  # greedy, stops at the end of the turn "
        "(generation_config.json)\n"
        "print(tokenizer.decode(out[0][ids['input_ids'].shape[1]:], skip_special_tokens=True))\n"
        "```"
    )
