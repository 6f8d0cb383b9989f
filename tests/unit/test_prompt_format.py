"""The prompt format from the recipe (`data.prompt`): FAR's own format stays byte for byte what
it was; the hashes and boxed answer formats drive the SFT target, the instruction, the format
rewards and answer extraction (rewards and evaluation alike); the dataset records the format so
later stages grade by it; `template: tokenizer` renders with the tokenizer's chat template and is
refused before any compute when the tokenizer has none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.artifacts import DatasetArtifact
from schemas.recipe import DataPrepConfig, PromptFormat
from stages import rewards
from stages.core.datasets import load_prompts, write_derived_dataset
from stages.core.errors import InputError
from stages.core.runner import RunContext
from stages.data_prep import build as data_prep
from stages.data_prep.adapters import Example
from stages.evaluate import evaluation
from stages.grpo import metrics
from stages.modeling.tokenizers import ByteTokenizer, NoChatTemplate, read_chat_template
from stages.registry import hashed_config
from stages.rewards.answers import extract_answer
from tests.conftest import recipe_with

TOK = ByteTokenizer()
HASHES, BOXED = PromptFormat(answer_format="hashes"), PromptFormat(answer_format="boxed")
TODAY_PROMPT = (
    "<start_of_turn>user\nThink step by step inside <reasoning> </reasoning>, then give only "
    "the final answer inside <answer> </answer>.\nWhat is 2+3?<end_of_turn>\n"
    "<start_of_turn>model\n"
)
# Gemma 3's chat template (Hugging Face tokenizer_config.json), its string-content path
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}"
    '{%- set first_user_prefix = "" -%}{%- set loop_messages = messages -%}{%- endif -%}'
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    '{{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}'
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}"
)


def _templated() -> ByteTokenizer:
    """The byte tokenizer with Gemma 3's chat template, as a real model's tokenizer ships it."""
    tokenizer = ByteTokenizer()
    tokenizer.chat_template = GEMMA3_TEMPLATE
    return tokenizer


def _ref(fmt: str, answer: str = "42") -> rewards.Reference:
    return rewards.Reference(answer, answer_format=fmt)  # type: ignore[arg-type]


def test_the_default_format_renders_byte_for_byte_as_before() -> None:
    assert data_prep.chat_prompt("What is 2+3?") == TODAY_PROMPT
    assert data_prep.chat_prompt("What is 2+3?", PromptFormat(), TOK) == TODAY_PROMPT
    assert data_prep.format_target("2 plus 3 is 5.", "5") == (
        "<reasoning>2 plus 3 is 5.</reasoning><answer>5</answer><end_of_turn>"
    )
    filler = PromptFormat(filler="No work needed.")
    assert data_prep.format_target("", "5", filler) == (
        "<reasoning>No work needed.</reasoning><answer>5</answer><end_of_turn>"
    )
    example = Example("x", "math", "s", "What is 2+3?", "2 plus 3 is 5.", "5")
    tokens, _ = data_prep.sft_sequence(example, TOK)
    target = "<reasoning>2 plus 3 is 5.</reasoning><answer>5</answer><end_of_turn>"
    assert tokens == [TOK.bos_id(), *TOK.encode(TODAY_PROMPT + target), TOK.eos_id()]


def test_the_default_format_stays_out_of_hashes_and_records() -> None:
    config = recipe_with("/tmp/unused").data
    assert "prompt" not in hashed_config("data_prep", config)
    changed = config.model_copy(update={"prompt": HASHES})
    assert hashed_config("data_prep", changed)["prompt"]["answer_format"] == "hashes"
    assert data_prep.identity(changed, recipe_with("/tmp/unused").model).digest != (
        data_prep.identity(config, recipe_with("/tmp/unused").model).digest
    )


@pytest.mark.parametrize(
    ("fmt", "target", "instruction"),
    [
        (HASHES, "He adds.\n#### 42<end_of_turn>", "on a last line that starts with '#### '"),
        (BOXED, "He adds.\n\\boxed{42}<end_of_turn>", "inside \\boxed{}"),
    ],
)
def test_each_answer_format_renders_its_target_and_instruction(
    fmt: PromptFormat, target: str, instruction: str
) -> None:
    assert data_prep.format_target("He adds.", "42", fmt) == target
    assert instruction in data_prep.chat_prompt("Q?", fmt)
    assert "<reasoning>" not in data_prep.chat_prompt("Q?", fmt)


def test_system_prompt_and_instruction_from_the_recipe() -> None:
    fmt = PromptFormat(system="You are terse.", instruction="Solve it.")
    assert data_prep.chat_prompt("Q?", fmt) == (
        "<start_of_turn>user\nYou are terse.\n\nSolve it.\nQ?<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(ValidationError, match="answer_format"):
        PromptFormat.model_validate({"answer_format": "json"})
    with pytest.raises(ValidationError, match="instruction"):
        PromptFormat.model_validate({"instruction": ""})


@pytest.mark.parametrize("fmt", ["tags", "hashes", "boxed"])
def test_a_target_scores_full_marks_in_its_own_format_only(fmt: str) -> None:
    prompt = PromptFormat(answer_format=fmt)  # type: ignore[arg-type]
    completion = data_prep.format_target("6 times 7 is 42.", "42", prompt)
    assert rewards.format_strict(completion, _ref(fmt)) == 1.0
    assert rewards.format_approx(completion, _ref(fmt)) == 1.0
    assert rewards.answer_match(completion, _ref(fmt)) == 1.0
    assert rewards.reasoning_quality(completion, _ref(fmt)) > 0
    for other in {"tags", "hashes", "boxed"} - {fmt}:
        assert rewards.format_strict(completion, _ref(other)) == 0.0, other
        # read in any format (tags reads '#### 42<end_of_turn>' as it always did: unequal)
        bare = completion.removesuffix("<end_of_turn>")
        assert rewards.answer_match(bare, _ref(other)) == 1.0


@pytest.mark.parametrize(
    ("completion", "strict", "approx"),
    [
        ("Six sevens.\n#### 42", 1.0, 1.0),
        ("  Six sevens.\n####42  \n<end_of_turn>\n", 1.0, 1.0),
        ("#### 42", 0.0, 0.75),  # no reasoning
        ("Six sevens. #### 42", 0.0, 0.75),  # the answer is not on its own line
        ("Six sevens.\n#### 42\nDone.", 0.0, 0.75),  # text after the answer line
        ("Six.\n#### 41\n#### 42", 0.0, 0.5),  # two answers
        ("Six sevens.\n#### ", 0.0, 0.75),  # no answer
        ("Six<end_of_turn>\n#### 42", 0.0, 0.0),  # a turn ended inside
        ("Six sevens, 42.", 0.0, 0.0),
    ],
)
def test_hashes_format_rewards(completion: str, strict: float, approx: float) -> None:
    assert rewards.format_strict(completion, _ref("hashes")) == strict
    assert rewards.format_approx(completion, _ref("hashes")) == approx


@pytest.mark.parametrize(
    ("completion", "strict", "approx"),
    [
        ("Six sevens.\n\\boxed{42}", 1.0, 1.0),
        ("Half: \\boxed{\\frac{1}{2}}<end_of_turn>", 1.0, 1.0),
        ("\\boxed{42}", 0.0, 0.75),  # no reasoning
        ("Six sevens. \\boxed{42}. Done.", 0.0, 0.75),  # text after the box
        ("Six sevens. \\boxed{}", 0.0, 0.75),  # an empty box
        ("\\boxed{6} then \\boxed{42}", 0.0, 0.5),
        ("Six sevens.\n\\boxed{42", 0.0, 0.75),  # never closed
    ],
)
def test_boxed_format_rewards(completion: str, strict: float, approx: float) -> None:
    assert rewards.format_strict(completion, _ref("boxed")) == strict
    assert rewards.format_approx(completion, _ref("boxed")) == approx


def test_extraction_looks_first_where_the_format_puts_the_answer() -> None:
    mixed = "<answer>5</answer> #### 6 \\boxed{7}"
    assert extract_answer(mixed) == "5"  # tags: as FAR always read it
    assert extract_answer(mixed, "hashes") == "6 \\boxed{7}"
    assert extract_answer(mixed, "boxed") == "7"
    assert extract_answer("#### 3 was a guess\n#### 42", "hashes") == "42"  # the final line
    assert extract_answer("#### 3 was a guess\n#### 42") == "3 was a guess"  # tags: unchanged
    assert extract_answer("no answer here", "boxed") is None
    assert extract_answer("Six sevens.\n#### 42<end_of_turn>", "hashes") == "42"


def test_code_is_read_from_the_whole_completion_outside_tags() -> None:
    code = "def f():\n    return 1\n"
    fenced = f"It returns one.\n```python\n{code}```\n#### f"
    assert rewards.extract_code(fenced, "hashes") == code.strip()
    assert rewards.extract_code(f"<answer>{code}</answer>") == code.strip()


def test_tunix_reward_fns_grade_in_the_dataset_format() -> None:
    (strict,) = rewards.tunix_reward_fns({"format_strict": 1.0}, answer_format="hashes")
    (tags,) = rewards.tunix_reward_fns({"format_strict": 1.0})
    completions = ["Six sevens.\n#### 42", "<reasoning>x</reasoning><answer>42</answer>"]
    assert strict(["p", "p"], completions, ["42", "42"]) == [1.0, 0.0]
    assert tags(["p", "p"], completions, ["42", "42"]) == [0.0, 1.0]


def test_grpo_format_rate_is_judged_in_the_dataset_format() -> None:
    hashes = metrics.StepObserver(2, 0, lambda: 1, lambda step: None, "hashes")
    tags = metrics.StepObserver(2, 0, lambda: 1, lambda step: None)
    completions = ["Six sevens.\n#### 42", "Seven sixes.\n#### 42"]
    assert hashes(["p", "p"], completions, [1.0, 1.0], None)[metrics.FORMAT_RATE][0] == 1.0
    assert tags(["p", "p"], completions, [1.0, 1.0], None)[metrics.FORMAT_RATE][0] == 0.0


def test_evaluation_scores_format_and_answers_in_the_dataset_format() -> None:
    rows = [{"id": "a", "answer": "42"}, {"id": "b", "answer": "7"}]
    completions = ["Six sevens.\n#### 42", "<reasoning>x</reasoning><answer>7</answer>"]
    hashes, _ = evaluation.score("m", None, rows, completions, 1, answer_format="hashes")
    tags, _ = evaluation.score("m", None, rows, completions, 1)
    assert (hashes.format_rate, hashes.accuracy) == (0.5, 1.0)
    assert (tags.format_rate, tags.accuracy) == (0.5, 1.0)
    wrong_line = ["Guess 3.\n#### 3\nNo:\n#### 42", "x"]
    assert evaluation.majority_accuracy(rows[:1], wrong_line[:1], 1, "hashes") == 1.0
    assert evaluation.majority_accuracy(rows[:1], wrong_line[:1], 1) == 0.0


def test_the_dataset_records_its_format_for_the_stages_after_it(tmp_path: Path) -> None:
    recipe = recipe_with(str(tmp_path), data={"prompt": {"answer_format": "hashes"}})
    dataset = data_prep.prepare(recipe.data, recipe.model, RunContext(str(tmp_path), "r")).output
    assert dataset.prompt == HASHES
    again = DatasetArtifact.model_validate_json(dataset.model_dump_json())
    assert again.prompt.answer_format == "hashes"
    rows = load_prompts(dataset, "grpo_train")
    assert all("'#### '" in r["prompt"] and "<reasoning>" not in r["prompt"] for r in rows)
    derived = write_derived_dataset(str(tmp_path / "derived"), dataset, {"grpo_train": rows})
    assert derived.prompt == HASHES  # hard_subset and self_teach carry it forward
    plain = DatasetArtifact.model_validate(
        {**dataset.model_dump(mode="json"), "prompt": PromptFormat().model_dump()}
    )
    assert "prompt" not in json.loads(plain.model_dump_json())  # default: records as before


def test_the_tokenizer_template_renders_with_the_tokenizers_own_chat_template() -> None:
    tokenizer = _templated()
    fmt = PromptFormat(template="tokenizer", system="You are terse.")
    gemma = PromptFormat(system="You are terse.")
    # Gemma's own template and FAR's Gemma markup agree, system prompt included
    assert data_prep.chat_prompt("Q?", fmt, tokenizer) == data_prep.chat_prompt("Q?", gemma)
    target = data_prep.format_target("r", "42", fmt, tokenizer, "Q?")
    assert target == "<reasoning>r</reasoning><answer>42</answer><end_of_turn>\n"
    example = Example("x", "math", "s", "Q?", "r", "42")
    tokens, mask = data_prep.sft_sequence(example, tokenizer, fmt)
    assert tokens[0] == tokenizer.bos_id() and tokens.count(tokenizer.bos_id()) == 1
    trained = tokenizer.decode([t for t, m in zip(tokens, mask, strict=True) if m])
    assert trained == target  # the loss covers the answer and the template's turn end


def test_a_template_that_rewrites_the_prompt_is_refused() -> None:
    tokenizer = ByteTokenizer()
    tokenizer.chat_template = "{{ messages[-1]['content'] }}"  # only the last turn
    fmt = PromptFormat(template="tokenizer")
    with pytest.raises(InputError, match=r"data\.prompt\.template"):
        data_prep.format_target("r", "42", fmt, tokenizer, "Q?")


def test_no_chat_template_is_an_input_error_before_any_data_is_read(tmp_path: Path) -> None:
    fmt = PromptFormat(template="tokenizer")
    with pytest.raises(NoChatTemplate, match=r"data\.prompt\.template: 'tokenizer'.*bytes-v1"):
        data_prep.chat_prompt("Q?", fmt, TOK)
    garbage = tmp_path / "rows.jsonl"  # read, it would be refused for its rows instead
    garbage.write_text("not json\n")
    source = {"kind": "file", "name": str(garbage), "adapter": "gsm8k"}
    splits = {name: {"size": 1, "sources": [source]} for name in ("eval", "grpo", "sft")}
    config = DataPrepConfig.model_validate({**splits, "prompt": {"template": "tokenizer"}})
    model = recipe_with(str(tmp_path)).model
    with pytest.raises(NoChatTemplate):
        data_prep.prepare(config, model, RunContext(str(tmp_path), "r"))


def test_far_validate_refuses_a_tokenizer_template_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from flows import cli
    from tests.conftest import smoke_data

    data = smoke_data()
    data["data"]["prompt"] = {"template": "tokenizer"}
    data["storage_root"] = str(tmp_path / "runs")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data))
    code = cli.main(["validate", str(recipe)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == cli.EXIT_INVALID and len(err) == 1, err
    assert "data.prompt.template: 'tokenizer' needs the model's chat template" in err[0]


def test_chat_template_read_from_a_model_directory(tmp_path: Path) -> None:
    assert read_chat_template(str(tmp_path)) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>"}))
    assert read_chat_template(str(tmp_path)) is None
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert read_chat_template(str(tmp_path)) == "D"
    (tmp_path / "chat_template.jinja").write_text(GEMMA3_TEMPLATE)
    assert read_chat_template(str(tmp_path)) == GEMMA3_TEMPLATE
