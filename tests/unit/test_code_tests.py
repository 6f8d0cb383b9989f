"""Test shapes parsed in the trusted parent, the strict value encoding, and the verdicts."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from stages.rewards.code_harness import CpuLimits, decode, read_results
from stages.rewards.code_tests import Check, Ungradable, parse_test, passes

HUMANEVAL = """
METADATA = {"author": "jt", "dataset": "test"}


def check(candidate):
    assert candidate([1.0, 2.0], 0.5) == False
    assert abs(candidate(3.5) - 0.5) < 1e-6
    assert True, "This prints if this assert fails"
    assert math.isclose(candidate(2), 4.0, rel_tol=1e-3)

check(has_close_elements)
"""

SHAPES: list[tuple[str, list[tuple[str, str, Any]]]] = [
    ("assert add(1, 2) == 3", [("add(1, 2)", "eq", 3)]),
    ("assert 3 == add(1, 2)", [("add(1, 2)", "eq", 3)]),
    ("assert f(1) != -2", [("f(1)", "ne", -2)]),
    ("assert set(f([1, 2])) == set([2, 1])", [("set(f([1, 2]))", "eq", {1, 2})]),
    ("assert sorted(f(x=3)) == [1, 2]", [("sorted(f(x=3))", "eq", [1, 2])]),
    ("assert f('a') == ('a', 1)", [("f('a')", "eq", ("a", 1))]),
    ("assert math.isclose(area(2), 12.56, rel_tol=0.001)", [("area(2)", "close", 12.56)]),
    ("assert is_prime(7)", [("is_prime(7)", "truthy", None)]),
    ("assert not is_prime(8)", [("is_prime(8)", "falsy", None)]),
    ("assert f(0) is None", [("f(0)", "is", None)]),
    ("assert f(0) is not None", [("f(0)", "not_none", None)]),
    ("assert f(1) == 1/3", [("f(1)", "eq", 1 / 3)]),
    ("assert f(1) == float('inf')", [("f(1)", "eq", math.inf)]),
    (
        HUMANEVAL,
        [
            ("has_close_elements([1.0, 2.0], 0.5)", "eq", False),
            ("has_close_elements(3.5)", "absdiff_lt", 0.5),
            ("has_close_elements(2)", "close", 4.0),
        ],
    ),
]


@pytest.mark.parametrize(("test", "expected"), SHAPES)
def test_shapes_become_calls_and_expected_values(test: str, expected: list[Any]) -> None:
    checks = parse_test(test)
    assert [(c.expression, c.kind, c.expected) for c in checks] == expected


@pytest.mark.parametrize(
    "test",
    [
        "for i in range(3):\n    assert f(i) == i",  # a loop
        "x = f(1)\nassert x == 1",  # a helper variable from the candidate
        "assert f(1) == g(2)",  # no constant side
        "assert f(1) < 3",  # another comparison
        "assert f(1) == 1 and f(2) == 2",  # a boolean of comparisons
        "def check(candidate):\n    for x in [1]:\n        assert candidate(x)\ncheck(f)",
        "print('no asserts')",
        "assert (",  # does not parse
    ],
)
def test_other_shapes_are_ungradable(test: str) -> None:
    with pytest.raises(Ungradable):
        parse_test(test)


@pytest.mark.parametrize(
    ("encoded", "value"),
    [
        (["int", "3"], 3),
        (["float", "0.5"], 0.5),
        (["v", True], True),
        (["v", None], None),
        (["v", "s"], "s"),
        (["tuple", [["int", "1"], ["v", "a"]]], (1, "a")),
        (["set", [["int", "1"], ["int", "2"]]], {1, 2}),
        (["dict", [[["int", "1"], ["list", []]]]], {1: []}),
        (["complex", ["1.0", "-2.0"]], 1 - 2j),
    ],
)
def test_decode_rebuilds_exact_builtins(encoded: Any, value: Any) -> None:
    decoded = decode(encoded)
    assert decoded == value and type(decoded) is type(value)


@pytest.mark.parametrize(
    "encoded",
    [
        ["v", 3],  # an int must say so
        ["int", 3],  # ... as a string
        ["int", "9" * 5000],  # too many digits
        ["object", "AlwaysEqual"],
        ["list", "not a list"],
        ["dict", [[["int", "1"]]]],
        "3",
        ["tuple", [["int", "1"]], "extra"],
    ],
)
def test_decode_refuses_everything_else(encoded: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        decode(encoded)


def test_a_second_line_for_a_call_voids_every_result() -> None:
    line = json.dumps([0, "ok", ["int", "3"]])
    assert read_results(line, 1) == [(True, 3)]
    assert read_results(f"{line}\n{line}", 1) == [(False, None)]
    assert read_results('garbage\n[5, "ok", ["int", "1"]]', 1) == [(False, None)]
    assert read_results("[" * 100_000, 1) == [(False, None)]  # too deep for json: ignored


@pytest.mark.parametrize(
    ("check", "value", "verdict"),
    [
        (Check("f()", "eq", 3), 3, True),
        (Check("f()", "eq", 3), 3.0, True),
        (Check("f()", "eq", 3), "3", False),
        (Check("f()", "close", 1.0, rel_tol=1e-3), 1.0005, True),
        (Check("f()", "close", 1.0, rel_tol=1e-3), True, False),  # a bool is not a number here
        (Check("f()", "absdiff_lt", 0.5, abs_tol=1e-6), 0.5, True),
        (Check("f()", "truthy"), [0], True),
        (Check("f()", "falsy"), [], True),
        (Check("f()", "is", None), None, True),
        (Check("f()", "is", True), 1, False),
    ],
)
def test_verdicts_in_the_parent(check: Check, value: Any, verdict: bool) -> None:
    assert passes(check, True, value) is verdict
    assert passes(check, False, value) is False  # a call that did not return never passes


@pytest.mark.parametrize(
    "test",
    [
        "assert (f(1) == 3) == True",  # the inner comparison would run beside the candidate
        "assert (f(1) == 3) is True",
        "assert not (f(1) != 3)",
        "assert f(1) == 3 or f(2) == 4",
        "assert bool(f(1) == 3)",
        "assert type(f(1)) == int",  # a builtin whose answer the value (or a shadow) decides
        "assert callable(f)",
        "assert all(x == 1 for x in f(1))",
        "assert f(1).startswith('a')",  # the returned value's own method answers
        "assert f(1).count(2) == 1",
    ],
)
def test_shapes_decided_only_inside_the_sandbox_are_ungradable(test: str) -> None:
    with pytest.raises(Ungradable):
        parse_test(test)


@pytest.mark.parametrize(
    ("test", "value", "verdict"),
    [  # the predicate runs here, on the value rebuilt from data
        ("assert isinstance(f(1), int)", 3, True),
        ("assert isinstance(f(1), (int, float))", "3", False),
        ("assert len(f(1)) == 3", [0], False),
        ("assert len(set(f(1))) == 1", {2}, True),  # set() ran in the sandbox
        ("assert round(f(1), 2) == 0.33", 1 / 3, True),
        ("assert all(f(1))", [1, 0], False),
        ("assert not any(f(1))", [0, 0], True),
        ("assert abs(f(1)) == 2", -2, True),
    ],
)
def test_builtin_predicates_are_applied_in_the_parent(test: str, value: Any, verdict: bool) -> None:
    (check,) = parse_test(test)
    assert check.expression in ("f(1)", "set(f(1))")
    assert passes(check, True, value) is verdict


def test_an_absolute_difference_keeps_integer_precision() -> None:
    (check,) = parse_test("assert abs(f() - 100000000000000000000) < 0.5")
    assert passes(check, True, 10**20) is True
    assert passes(check, True, 10**20 + 1) is False  # 1e20 as a float cannot tell them apart
    (check,) = parse_test("assert abs(f() - 0.1) <= 1e-9")
    assert passes(check, True, 0.1) is True and passes(check, True, 0.2) is False


def test_a_function_named_like_a_builtin_is_the_candidates() -> None:
    """MBPP task 116's function is called `sum`: called on constants, it is the candidate's."""
    (check,) = parse_test("assert sum(10, 15) == 6")
    assert (check.expression, check.kind, check.expected, check.wrappers) == (
        "sum(10, 15)",
        "eq",
        6,
        (),
    )
    (check,) = parse_test("assert len([1, 2]) == 2")
    assert check.expression == "len([1, 2])" and check.wrappers == ()
    (check,) = parse_test("assert math.floor(f(1)) == 3")  # a module's function stays inside
    assert check.expression == "math.floor(f(1))"


def test_line_times_follow_newlines_only() -> None:
    """Other line breaks (\\r, \\u2028) in a line the candidate writes must not shift the
    parent's CPU times onto earlier lines (which would hide a slow call)."""
    limits = CpuLimits(start_seconds=1.0, call_seconds=1.0)
    lines = ["x\ry\rz", '[-1, "ready", null]', '[0, "ok", ["int", "3"]]']
    stdout = "\n".join(lines) + "\n"
    assert read_results(stdout, 1, [0.1, 0.2, 0.5], limits) == [(True, 3)]
    assert read_results(stdout, 1, [0.1, 0.2, 5.0], limits) == [(False, None)]  # 4.8 s call
