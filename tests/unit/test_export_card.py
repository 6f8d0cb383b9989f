"""The model card carries the prompt format the run trained with (system prompt, instruction,
answer format, chat template) and a usage example prompting with the run's own first eval
prompt, exactly as FAR rendered it.

The run is real: a data_prep stage over a small JSONL file with its own system prompt and
instruction, and a training-like stage (tests/unit/test_records.py) consuming its dataset.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from schemas.recipe import PromptFormat
from stages.core.datasets import load_prompts
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.modeling import export_card
from tests.conftest import recipe_with
from tests.unit.test_records import checkpoint_stage

SYSTEM = "You reverse words. Nothing else."
INSTRUCTION = "Reverse the word, then give it inside <answer> </answer>."
QUESTIONS = [f"Reverse the word w{i}ord." for i in range(12)]


def _card(tmp_path: Path, adapter: bool = False) -> tuple[str, str, PromptFormat]:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"q": q, "a": q[17:-1][::-1]}) + "\n" for q in QUESTIONS))
    source = {"kind": "file", "name": str(rows), "columns": {"prompt": "q", "answer": "a"}}
    prompt = {"system": SYSTEM, "instruction": INSTRUCTION, "answer_format": "answer"}
    data = {
        "eval": {"size": 3, "sources": [source]},
        "grpo": {"size": 3, "sources": [source]},
        "sft": {"size": 4, "sources": [source]},
        "prompt": prompt,
    }
    recipe = recipe_with(str(tmp_path), data=data)
    ctx = RunContext(str(tmp_path), "card")
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    sft = checkpoint_stage(
        ctx, "sft", {"dataset": dataset.fingerprint}, {"dataset": dataset.uri}
    ).output
    first = load_prompts(dataset, "eval")[0]["prompt"]
    card = export_card.model_card(export_card.gather(sft.uri), adapter)
    return card, first, dataset.prompt


def test_the_card_holds_the_prompt_format_and_a_usage_example_from_the_runs_data(
    tmp_path: Path,
) -> None:
    card, first, fmt = _card(tmp_path)
    section = card.split("## Prompt format\n\n")[1].split("\n\n##")[0]
    assert f"- system prompt: `{SYSTEM}`" in section
    assert f"- instruction (before each question, on its own line): `{INSTRUCTION}`" in section
    assert "- answer format: `answer`" in section and "- chat template: `gemma`" in section
    usage = card.split("## Use\n\n")[1]
    [line] = re.findall(r"^prompt = (.*)$", usage, re.MULTILINE)
    shown = json.loads(line)
    assert shown == first  # the first eval prompt, exactly as FAR rendered it
    # ...and that is one of the run's own rows, rendered as data_prep renders a question
    assert any(shown == data_prep.chat_prompt(q, fmt) for q in QUESTIONS)
    assert "Calculate 12 + 7." not in card  # no generic example


def test_an_adapter_card_loads_with_peft_and_prompts_the_same(tmp_path: Path) -> None:
    card, first, _ = _card(tmp_path, adapter=True)
    usage = card.split("## Use\n\n")[1]
    assert "PeftModel.from_pretrained" in usage
    assert f"prompt = {json.dumps(first, ensure_ascii=False)}" in usage


def test_a_card_without_a_data_prep_record_says_so(tmp_path: Path) -> None:
    ctx = RunContext(str(tmp_path), "bare")
    sft = checkpoint_stage(ctx, "sft", {}, {}).output
    card = export_card.model_card(export_card.gather(sft.uri), adapter=False)
    assert "its prompt format is not known" in card
    assert "no eval prompt to show" in card
