"""Grade model-written code against MBPP/HumanEval tests so that the code cannot forge its verdict.

The trusted parent parses each test with `ast`; only the expressions that call the candidate's
code go into the sandbox. The sandbox evaluates them and writes back plain data in a strict
encoding (JSON of tagged builtin values: the exact type is checked, so no subclass and no
custom `__eq__` survives; the only exceptions are collections' Counter, OrderedDict and
defaultdict, whose exact types are captured before the candidate runs and whose items are read
with `dict.items`, so they arrive as plain dicts). The expected values never enter the
sandbox; the parent rebuilds each value from the encoding and compares it there. Whatever the
sandbox prints, it can only claim values that the candidate could have returned anyway.

Test shapes and what a pass guarantees (`X` is an expression over the candidate's names, `E`
a constant the parent evaluates: a literal or set/frozenset/tuple/list/sorted/float/int/str/
dict of literals):
- `assert X == E` / `assert E == X` / `assert X != E`: X's value, rebuilt as builtins, equals
  (differs from) E under Python's own `==` on builtins.
- `assert X is True|False|None`, `assert X is not None`: the rebuilt value is that singleton.
- `assert X` / `assert not X`: the rebuilt value is truthy / falsy (so X must return builtins).
- `assert math.isclose(X, E, rel_tol=.., abs_tol=..)` and `assert abs(X - E) < tol` (or `<=`):
  X's value is a real number (int or float, not bool) that close to E (`abs` exactly, in
  fractions: an int keeps every digit).
- `set(X) == E`, `sorted(X) == E` and the like are the first shape: the container is built in
  the sandbox and comes back as data (a shadowed `set` can only claim a value the candidate
  could have returned).
- Builtins the test applies to X (`len`, `isinstance` with builtin types, `all`, `any`,
  `round`, `abs`, `sum`, `min`, `max`, `int`, `float`, `str`, `bool`) are applied here, to the
  rebuilt value: in the sandbox the candidate could shadow them or its value answer them.
  Nothing that decides (a comparison, `not`, `and`/`or`, another builtin) runs in the sandbox:
  `(X == E) == True` is ungradable.
- Time: the parent judges each call by the sandbox's CPU time when its line arrived
  (`read_results`, stages/rewards/code_harness.py), so a call that dodges the alarm inside
  gains nothing.
- The parent's own work on a result is bounded (`decode`, stages/rewards/code_harness.py).
- HumanEval: `def check(candidate):` whose body is only such asserts (plus `import`s and a
  docstring), then `check(entry_point)`; every assert must pass.
Anything else (loops, helper variables, calls on the expected side, custom comparisons) is
ungradable: it scores 0 and is counted, never run the old way.
"""

from __future__ import annotations

import ast
import builtins
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

_SAFE_CALLS: dict[str, Callable[..., Any]] = {
    "set": set,
    "frozenset": frozenset,
    "tuple": tuple,
    "list": list,
    "sorted": sorted,
    "float": float,
    "int": int,
    "str": str,
    "dict": dict,
    "complex": complex,
}


@dataclass(frozen=True)
class Check:
    """One comparison: `expression` runs in the sandbox; `wrappers` (builtins such as `len` or
    `isinstance` that the test applies to its value), `kind` and `expected` are judged here."""

    expression: str
    kind: str  # eq | ne | is | truthy | falsy | close | absdiff_lt | absdiff_le | not_none
    expected: Any = None
    rel_tol: float = 1e-9
    abs_tol: float | int = 0.0
    wrappers: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # innermost first: (name, more args)


class Ungradable(ValueError):
    """A test whose shape cannot be graded without running it beside the candidate."""


def constant(node: ast.expr) -> Any:
    """The value of a trusted constant expression, or Ungradable."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -constant(node.operand)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn = _SAFE_CALLS.get(node.func.id)
        if fn is not None:
            return fn(*[constant(a) for a in node.args])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div | ast.Mult | ast.Add | ast.Sub):
        left, right = constant(node.left), constant(node.right)
        if all(type(v) in (int, float) for v in (left, right)):
            return _ARITH[type(node.op)](left, right)
    raise Ungradable(f"not a constant: {ast.unparse(node)[:80]}")


_ARITH: dict[type, Callable[[Any, Any], Any]] = {
    ast.Div: lambda a, b: a / b,
    ast.Mult: lambda a, b: a * b,
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
}


def _is_constant(node: ast.expr) -> bool:
    try:
        constant(node)
        return True
    except (Ungradable, ValueError, TypeError, ArithmeticError):
        return False


# Builtins a test applies to the candidate's value that the parent applies instead, on the value
# rebuilt from data (in the sandbox the candidate could shadow them, or its value could answer
# them: `isinstance` reads `__class__`, `len` calls `__len__`).
_PARENT_FUNCS: dict[str, Callable[..., Any]] = {
    "len": len,
    "abs": abs,
    "round": round,
    "bool": bool,
    "all": all,
    "any": any,
    "sum": sum,
    "min": min,
    "max": max,
    "int": int,
    "float": float,
    "str": str,
    "isinstance": isinstance,
}
_TYPES: dict[str, type] = {
    t.__name__: t
    for t in (int, float, str, bool, list, tuple, dict, set, frozenset, complex, bytes)
}
# Builtins that may stay in the sandbox: they build a fresh container (or iterator) of the
# candidate's own values, which arrive as data, so a shadow can only claim values the candidate
# could have returned itself.
_DATA_FUNCS = frozenset(
    {"set", "frozenset", "sorted", "list", "tuple", "dict", "map", "filter", "zip", "reversed"}
    | {"enumerate", "range"}
)
_BUILTIN_NAMES = frozenset(dir(builtins))
MAX_CONVERTED_TEXT = 100  # int()/float() of a returned string, applied here: short ones only


def _peel(node: ast.expr) -> tuple[ast.expr, tuple[tuple[str, tuple[Any, ...]], ...]]:
    """(the part the sandbox evaluates, the builtins applied here around it, innermost first)."""
    wrappers: list[tuple[str, tuple[Any, ...]]] = []
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _PARENT_FUNCS
        and node.args
        and not _is_constant(node.args[0])  # `sum(10, 15)`: the candidate's own `sum`
        and not node.keywords
        and not any(isinstance(a, ast.Starred) for a in node.args)
    ):
        extra = tuple(_wrapper_arg(node.func.id, a) for a in node.args[1:])
        wrappers.append((node.func.id, extra))
        node = node.args[0]
    _only_data(node)
    return node, tuple(reversed(wrappers))


def _wrapper_arg(name: str, node: ast.expr) -> Any:
    if name == "isinstance":
        names = node.elts if isinstance(node, ast.Tuple) else [node]
        if not all(isinstance(n, ast.Name) and n.id in _TYPES for n in names):
            raise Ungradable(f"isinstance of other than builtin types: {ast.unparse(node)[:80]}")
        return tuple(_TYPES[n.id] for n in names)  # type: ignore[attr-defined]
    if name == "round":
        value = constant(node)
        if type(value) is int:
            return value
    raise Ungradable(f"{name}() with more than the value: {ast.unparse(node)[:80]}")


def _only_data(node: ast.expr) -> None:
    """Refuse a candidate side that decides something in the sandbox: a comparison, a boolean,
    `not`, a conditional, or a builtin other than a container of the candidate's values.
    Arguments of the candidate's own calls are its inputs and are not looked into; a call of a
    builtin's name on constants only (MBPP's `sum(10, 15)`) is the candidate's own function."""
    if isinstance(node, ast.Call):
        func = node.func
        inputs_only = all(_is_constant(a) for a in node.args)  # a function the candidate named
        if isinstance(func, ast.Name) and func.id in _BUILTIN_NAMES and not inputs_only:
            if func.id not in _DATA_FUNCS:
                raise Ungradable(f"{func.id}() would be decided beside the candidate")
            for arg in node.args:
                _only_data(arg.value if isinstance(arg, ast.Starred) else arg)
        if isinstance(func, ast.Attribute) and _computed(func.value):
            raise Ungradable(f"a method of a returned value: {ast.unparse(node)[:80]}")
        return  # the candidate's (or a module's) function: its arguments are inputs
    if isinstance(node, ast.Subscript | ast.Attribute):
        _only_data(node.value)
    elif isinstance(node, ast.BinOp):
        _only_data(node.left)
        _only_data(node.right)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        _only_data(node.operand)
    elif isinstance(node, ast.List | ast.Tuple | ast.Set):
        for element in node.elts:
            _only_data(element)
    elif not isinstance(node, ast.Name | ast.Constant):
        raise Ungradable(f"{type(node).__name__} would be decided beside the candidate")


def _computed(node: ast.expr) -> bool:
    """True for a value computed by a call (`f(x).startswith` is the value's own method: it
    could answer anything), not for a module's or a constant's attribute (`math.floor`)."""
    return any(isinstance(n, ast.Call) for n in ast.walk(node))


def _split(left: ast.expr, right: ast.expr) -> tuple[ast.expr, Any]:
    """(the candidate side, the expected value) of a comparison."""
    if _is_constant(right) and not _is_constant(left):
        return left, constant(right)
    if _is_constant(left) and not _is_constant(right):
        return right, constant(left)
    raise Ungradable("a comparison needs exactly one constant side")


def _isclose(call: ast.Call, rename: dict[str, str]) -> Check:
    if len(call.args) != 2:
        raise Ungradable("isclose with other than two arguments")
    side, expected = _split(call.args[0], call.args[1])
    tolerances = {"rel_tol": 1e-9, "abs_tol": 0.0}
    for keyword in call.keywords:
        if keyword.arg not in tolerances:
            raise Ungradable(f"isclose keyword {keyword.arg}")
        tolerances[keyword.arg] = float(constant(keyword.value))
    return _check(side, rename, "close", float(expected), **tolerances)


def _check(side: ast.expr, rename: dict[str, str], kind: str, *args: Any, **kw: Any) -> Check:
    """The Check of a candidate side: what the sandbox evaluates and what is applied here."""
    inner, wrappers = _peel(side)
    return replace(Check(_source(inner, rename), kind, *args, **kw), wrappers=wrappers)


def _is_isclose(node: ast.expr) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Attribute) and func.attr == "isclose") or (
        isinstance(func, ast.Name) and func.id == "isclose"
    )


def _absdiff(node: ast.Compare, rename: dict[str, str]) -> Check | None:
    """`abs(X - E) < tol` (or <=)."""
    inner = node.left
    if not (
        isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Name)
        and inner.func.id == "abs"
        and len(inner.args) == 1
        and isinstance(inner.args[0], ast.BinOp)
        and isinstance(inner.args[0].op, ast.Sub)
        and isinstance(node.ops[0], ast.Lt | ast.LtE)
    ):
        return None
    side, expected = _split(inner.args[0].left, inner.args[0].right)
    kind = "absdiff_lt" if isinstance(node.ops[0], ast.Lt) else "absdiff_le"
    tolerance = constant(node.comparators[0])
    if not all(_real(v) for v in (expected, tolerance)):
        raise Ungradable("abs(X - E) < tol with other than numbers")
    return _check(side, rename, kind, expected, abs_tol=tolerance)  # exact: ints stay ints


def _source(node: ast.expr, rename: dict[str, str]) -> str:
    """The candidate-side expression, with HumanEval's `candidate` renamed to the entry point."""
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and child.id in rename:
            child.id = rename[child.id]
    return ast.unparse(node)


def check_of_assert(node: ast.Assert, rename: dict[str, str]) -> Check:
    test = node.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, right = test.ops[0], test.comparators[0]
        found = _absdiff(test, rename)
        if found is not None:
            return found
        if isinstance(op, ast.Is | ast.IsNot) and isinstance(right, ast.Constant):
            if isinstance(op, ast.IsNot):
                if right.value is not None:
                    raise Ungradable("`is not` other than None")
                return _check(test.left, rename, "not_none")
            return _check(test.left, rename, "is", right.value)
        if isinstance(op, ast.Eq | ast.NotEq):
            side, expected = _split(test.left, right)
            return _check(side, rename, "eq" if isinstance(op, ast.Eq) else "ne", expected)
        raise Ungradable(f"comparison {type(op).__name__}")
    if _is_isclose(test):
        return _isclose(test, rename)  # type: ignore[arg-type]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _check(test.operand, rename, "falsy")
    if isinstance(test, ast.Call | ast.Name | ast.Subscript | ast.Attribute):
        return _check(test, rename, "truthy")
    raise Ungradable(f"assert of {type(test).__name__}")


def _humaneval_checks(module: ast.Module) -> list[Check]:
    """`def check(candidate): assert ...` followed by `check(entry)`."""
    checks_fn = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    calls = [
        n.value
        for n in module.body
        if isinstance(n, ast.Expr)
        and isinstance(n.value, ast.Call)
        and isinstance(n.value.func, ast.Name)
        and n.value.func.id == "check"
    ]
    if len(checks_fn) != 1 or len(calls) != 1 or len(calls[0].args) != 1:
        raise Ungradable("not one check() and one check(entry_point)")
    entry = calls[0].args[0]
    if not isinstance(entry, ast.Name) or len(checks_fn[0].args.args) != 1:
        raise Ungradable("check() takes other than one candidate")
    rename = {checks_fn[0].args.args[0].arg: entry.id}
    return _asserts(checks_fn[0].body, rename)


def _asserts(body: Sequence[ast.stmt], rename: dict[str, str]) -> list[Check]:
    checks = []
    for statement in body:
        if isinstance(statement, ast.Assert) and _always_true(statement.test):
            continue  # HumanEval's `assert True, "message"`
        if isinstance(statement, ast.Assert):
            checks.append(check_of_assert(statement, rename))
        elif _harmless(statement):
            continue
        else:
            raise Ungradable(f"statement {type(statement).__name__} in a test")
    if not checks:
        raise Ungradable("a test without asserts")
    return checks


def _always_true(test: ast.expr) -> bool:
    return isinstance(test, ast.Constant) and bool(test.value)


def _harmless(statement: ast.stmt) -> bool:
    """Imports, docstrings and constant assignments (HumanEval's METADATA)."""
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return True
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return True
    return isinstance(statement, ast.Assign) and _is_constant(statement.value)


def parse_test(test: str) -> list[Check]:
    """The checks of one test string (MBPP assert lines or a HumanEval check program)."""
    try:
        module = ast.parse(test)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise Ungradable(f"test does not parse: {e}") from e
    if any(isinstance(n, ast.FunctionDef) for n in module.body):
        return _humaneval_checks(module)
    return _asserts(module.body, {})


def imports_of(tests: Sequence[str]) -> list[str]:
    """The import statements of the tests (e.g. `import math`), run before the calls."""
    found = []
    for test in tests:
        try:
            module = ast.parse(test)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        for node in ast.walk(module):
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append(ast.unparse(node))
    return sorted(set(found))


def passes(check: Check, returned: bool, value: Any) -> bool:
    """The verdict of one check on a value rebuilt from the strict encoding (the test's own
    builtins applied here first)."""
    if not returned:
        return False
    try:
        for name, extra in check.wrappers:
            value = _apply(name, value, extra)
        return _JUDGES[check.kind](check, value)
    except (TypeError, ValueError, ArithmeticError):
        return False


def _apply(name: str, value: Any, extra: tuple[Any, ...]) -> Any:
    if name in ("int", "float") and type(value) is str and len(value) > MAX_CONVERTED_TEXT:
        raise ValueError("a long string to convert")
    return _PARENT_FUNCS[name](value, *extra)


def _real(value: Any) -> bool:
    return type(value) in (int, float)


def _distance(value: Any, expected: Any) -> Fraction:
    """|value - expected| exactly (an int keeps every digit; a float is its exact binary value)."""
    if not (_real(value) and math.isfinite(value) and math.isfinite(expected)):
        raise ValueError("not a finite real number")
    return abs(Fraction(value) - Fraction(expected))


_JUDGES: dict[str, Callable[[Check, Any], bool]] = {
    "eq": lambda c, v: bool(v == c.expected),
    "ne": lambda c, v: bool(v != c.expected),
    "is": lambda c, v: v is c.expected,
    "not_none": lambda c, v: v is not None,
    "truthy": lambda c, v: bool(v),
    "falsy": lambda c, v: not v,
    "close": lambda c, v: (
        _real(v) and math.isclose(v, c.expected, rel_tol=c.rel_tol, abs_tol=c.abs_tol)
    ),
    "absdiff_lt": lambda c, v: _distance(v, c.expected) < Fraction(c.abs_tol),
    "absdiff_le": lambda c, v: _distance(v, c.expected) <= Fraction(c.abs_tol),
}
