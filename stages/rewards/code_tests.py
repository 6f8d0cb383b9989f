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
  X's value is a real number (int or float, not bool) that close to E.
- `set(X) == E`, `sorted(X) == E` and the like are the first shape: the whole left side is
  evaluated in the sandbox, the set or sorted list comes back as data.
- HumanEval: `def check(candidate):` whose body is only such asserts (plus `import`s and a
  docstring), then `check(entry_point)`; every assert must pass.
Anything else (loops, helper variables, calls on the expected side, custom comparisons) is
ungradable: it scores 0 and is counted, never run the old way.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
MAX_VALUE_DEPTH = 50


@dataclass(frozen=True)
class Check:
    """One comparison: `expression` runs in the sandbox, `kind` and `expected` are judged here."""

    expression: str
    kind: str  # eq | ne | is | truthy | falsy | close | absdiff_lt | absdiff_le | not_none
    expected: Any = None
    rel_tol: float = 1e-9
    abs_tol: float = 0.0


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
    return Check(_source(side, rename), "close", float(expected), **tolerances)


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
    return Check(
        _source(side, rename), kind, float(expected), abs_tol=float(constant(node.comparators[0]))
    )


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
                return Check(_source(test.left, rename), "not_none")
            return Check(_source(test.left, rename), "is", right.value)
        if isinstance(op, ast.Eq | ast.NotEq):
            side, expected = _split(test.left, right)
            return Check(_source(side, rename), "eq" if isinstance(op, ast.Eq) else "ne", expected)
        raise Ungradable(f"comparison {type(op).__name__}")
    if _is_isclose(test):
        return _isclose(test, rename)  # type: ignore[arg-type]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return Check(_source(test.operand, rename), "falsy")
    if isinstance(test, ast.Call | ast.Name | ast.Subscript | ast.Attribute):
        return Check(_source(test, rename), "truthy")
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


# In the sandbox: run the candidate's code, then each call with its own alarm, and write one
# line per call: [index, "ok", encoded value] or [index, "error", exception name].
HARNESS = r"""
import json, os, signal, sys
from collections import Counter, OrderedDict, defaultdict
_DICTS = (dict, Counter, OrderedDict, defaultdict)  # captured before the candidate runs
_data = json.loads(DATA)
_calls = _data["calls"]
_out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # the candidate's own prints go to stderr

class _Slow(BaseException):
    pass

def _alarm(signum, frame):
    raise _Slow()

def _enc(v, depth=0):
    if depth > _data["max_depth"]:
        raise ValueError("too deep")
    t = type(v)
    if v is None or t is bool or t is str:
        return ["v", v]
    if t is int:
        return ["int", str(v)]
    if t is float:
        return ["float", repr(v)]
    if t is complex:
        return ["complex", [repr(v.real), repr(v.imag)]]
    if t in (list, tuple, set, frozenset):
        return [t.__name__, [_enc(x, depth + 1) for x in v]]
    if t in _DICTS:  # read through dict's own method: an override cannot lie about items
        return ["dict", [[_enc(k, depth + 1), _enc(x, depth + 1)] for k, x in dict.items(v)]]
    raise TypeError("not a builtin value: " + t.__name__)

signal.signal(signal.SIGALRM, _alarm)
_ns = {"__name__": "__main__"}
try:
    signal.setitimer(signal.ITIMER_REAL, _data["seconds"])
    exec(compile(_data["code"], "<candidate>", "exec"), _ns)
    signal.setitimer(signal.ITIMER_REAL, 0)
    _failed = None
except BaseException as e:
    _failed = type(e).__name__
for _i, _call in enumerate(_calls):
    if _failed is not None:
        _line = [_i, "error", _failed]
    else:
        try:
            signal.setitimer(signal.ITIMER_REAL, _data["seconds"])
            _line = [_i, "ok", _enc(eval(_call, _ns))]
            signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as e:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _line = [_i, "error", type(e).__name__]
    _out.write(json.dumps(_line) + "\n")
    _out.flush()
os._exit(0)
"""


def harness(code: str, imports: Sequence[str], calls: Sequence[str], seconds: float) -> str:
    """The sandboxed program: the test imports, the candidate's code, then each call."""
    data = {
        "code": "\n".join([*imports, code]),
        "calls": list(calls),
        "seconds": seconds,
        "max_depth": MAX_VALUE_DEPTH,
    }
    return HARNESS.replace("DATA", repr(json.dumps(data)))


def decode(node: Any, depth: int = 0) -> Any:
    """A value rebuilt from the strict encoding; ValueError for anything else."""
    if depth > MAX_VALUE_DEPTH or type(node) is not list or len(node) != 2:
        raise ValueError("malformed value")
    tag, payload = node
    if tag == "v" and (payload is None or type(payload) in (bool, str)):
        return payload
    if tag == "int" and type(payload) is str and len(payload) <= 4300:
        return int(payload)
    if tag == "float" and type(payload) is str:
        return float(payload)
    if tag == "complex" and type(payload) is list and len(payload) == 2:
        return complex(float(payload[0]), float(payload[1]))
    if tag in ("list", "tuple", "set", "frozenset") and type(payload) is list:
        items = [decode(x, depth + 1) for x in payload]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict" and type(payload) is list:
        pairs = [(decode(p[0], depth + 1), decode(p[1], depth + 1)) for p in _pairs(payload)]
        return dict(pairs)
    raise ValueError(f"unknown tag {tag!r}")


def _pairs(payload: list[Any]) -> list[list[Any]]:
    if not all(type(p) is list and len(p) == 2 for p in payload):
        raise ValueError("malformed dict")
    return payload


def read_results(stdout: str, count: int) -> list[tuple[bool, Any]]:
    """(returned, value) per call from the sandbox's lines; a missing call did not return.

    A second line for the same call means the candidate wrote into the channel: every call
    then counts as not returned.
    """
    seen: dict[int, tuple[bool, Any]] = {}
    for line in stdout.splitlines():
        try:
            index, status, payload = json.loads(line)
        except (ValueError, TypeError, RecursionError):
            continue
        if type(index) is not int or not 0 <= index < count:
            continue
        if index in seen:
            return [(False, None)] * count
        try:
            seen[index] = (True, decode(payload)) if status == "ok" else (False, None)
        except (ValueError, TypeError, OverflowError, RecursionError):
            seen[index] = (False, None)
    return [seen.get(i, (False, None)) for i in range(count)]


def passes(check: Check, returned: bool, value: Any) -> bool:
    """The verdict of one check on a value rebuilt from the strict encoding."""
    if not returned:
        return False
    try:
        return _JUDGES[check.kind](check, value)
    except (TypeError, ValueError, ArithmeticError):
        return False


def _real(value: Any) -> bool:
    return type(value) in (int, float)


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
    "absdiff_lt": lambda c, v: _real(v) and abs(v - c.expected) < c.abs_tol,
    "absdiff_le": lambda c, v: _real(v) and abs(v - c.expected) <= c.abs_tol,
}
