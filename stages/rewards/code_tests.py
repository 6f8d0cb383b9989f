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
  (`read_results`), so a call that dodges the alarm inside gains nothing.
- The parent's own work on a result is bounded (`decode`).
- HumanEval: `def check(candidate):` whose body is only such asserts (plus `import`s and a
  docstring), then `check(entry_point)`; every assert must pass.
Anything else (loops, helper variables, calls on the expected side, custom comparisons) is
ungradable: it scores 0 and is counted, never run the old way.
"""

from __future__ import annotations

import ast
import builtins
import itertools
import json
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
MAX_VALUE_DEPTH = 50


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


# In the sandbox: run the candidate's code, write a "ready" line, then run each call with its
# own CPU-time alarm and write one line per call: [index, "ok", encoded value] or
# [index, "error", exception name]. The alarm only stops honest slow calls early: the limit
# that counts is measured by the parent from outside (`read_results`).
HARNESS = r"""
import json, os, random, signal, sys
random.seed(0)  # the same completion draws the same numbers in every sandbox
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

def _write(line):
    _out.write(json.dumps(line) + "\n")
    _out.flush()

signal.signal(signal.SIGPROF, _alarm)
_ns = {"__name__": "__main__"}
try:
    signal.setitimer(signal.ITIMER_PROF, _data["seconds"])
    exec(compile(_data["code"], "<candidate>", "exec"), _ns)
    signal.setitimer(signal.ITIMER_PROF, 0)
    _failed = None
except BaseException as e:
    _failed = type(e).__name__
_write([-1, "ready", None])
for _i, _call in enumerate(_calls):
    if _failed is not None:
        _line = [_i, "error", _failed]
    else:
        try:
            signal.setitimer(signal.ITIMER_PROF, _data["seconds"])
            _line = [_i, "ok", _enc(eval(_call, _ns))]
            signal.setitimer(signal.ITIMER_PROF, 0)
        except BaseException as e:
            signal.setitimer(signal.ITIMER_PROF, 0)
            _line = [_i, "error", type(e).__name__]
    _write(_line)
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


MAX_NODES = 100_000  # values rebuilt per sandbox: bounds the parent's decoding work
MAX_FLOAT_TEXT = 40  # repr() of any float is shorter
MAX_SAME_HASH = 8  # elements of one set/dict sharing a hash (beyond that: a crafted collision)


@dataclass
class _Budget:
    """The work the parent will still do to rebuild one sandbox's values."""

    nodes: int = MAX_NODES

    def spend(self, count: int) -> None:
        self.nodes -= count
        if self.nodes < 0:
            raise ValueError("the result is larger than the parent rebuilds")


def decode(node: Any, depth: int = 0, budget: _Budget | None = None) -> Any:
    """A value rebuilt from the strict encoding; ValueError for anything else.

    The work is bounded: at most MAX_NODES values (hashing counted again for each set or dict
    element), ints of at most 4300 digits, floats from short text, and no set or dict whose
    elements collide in their hashes (that would make building it quadratic)."""
    return _decode(node, depth, budget or _Budget())[0]


def _decode(node: Any, depth: int, budget: _Budget) -> tuple[Any, int]:
    """(the value, how many nodes it has)."""
    budget.spend(1)
    if depth > MAX_VALUE_DEPTH or type(node) is not list or len(node) != 2:
        raise ValueError("malformed value")
    tag, payload = node
    if tag == "v" and (payload is None or type(payload) in (bool, str)):
        return payload, 1
    if tag == "int" and type(payload) is str and len(payload) <= 4300:
        return int(payload), 1
    if tag == "float" and type(payload) is str and len(payload) <= MAX_FLOAT_TEXT:
        return float(payload), 1
    if tag == "complex" and type(payload) is list and len(payload) == 2:
        real, imag = (_decode(["float", p], depth + 1, budget)[0] for p in payload)
        return complex(real, imag), 1
    if tag in _CONTAINERS and type(payload) is list:
        return _container(tag, payload, depth, budget)
    if tag == "dict" and type(payload) is list:
        return _dict(payload, depth, budget)
    raise ValueError(f"unknown tag {tag!r}")


_CONTAINERS: dict[str, type] = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


def _container(tag: str, payload: list[Any], depth: int, budget: _Budget) -> tuple[Any, int]:
    built = [_decode(x, depth + 1, budget) for x in payload]
    items, nodes = [v for v, _ in built], sum(n for _, n in built)
    if tag in ("set", "frozenset"):
        _hashable(items, nodes, budget)
    return _CONTAINERS[tag](items), 1 + nodes


def _dict(payload: list[Any], depth: int, budget: _Budget) -> tuple[Any, int]:
    keys = [_decode(p[0], depth + 1, budget) for p in _pairs(payload)]
    values = [_decode(p[1], depth + 1, budget) for p in payload]
    _hashable([k for k, _ in keys], sum(n for _, n in keys), budget)
    nodes = sum(n for _, n in keys) + sum(n for _, n in values)
    return dict(zip([k for k, _ in keys], [v for v, _ in values], strict=True)), 1 + nodes


def _hashable(items: list[Any], nodes: int, budget: _Budget) -> None:
    """Refuse elements crafted to share one hash (each insertion would compare with them all)."""
    budget.spend(nodes)  # hashing a tuple walks it again
    hashes = [hash(x) for x in items]
    if len(hashes) - len(set(hashes)) > MAX_SAME_HASH:
        raise ValueError("set or dict elements collide in their hashes")


def _pairs(payload: list[Any]) -> list[list[Any]]:
    if not all(type(p) is list and len(p) == 2 for p in payload):
        raise ValueError("malformed dict")
    return payload


@dataclass(frozen=True)
class CpuLimits:
    """CPU seconds, measured by the parent from outside the sandbox (`line_cpu`): for starting
    and the candidate's own top-level code (until the "ready" line), then for each call (from
    the line before it to its own line, whatever the process did meanwhile, threads included)."""

    start_seconds: float
    call_seconds: float


def read_results(
    stdout: str,
    count: int,
    line_cpu: Sequence[float] | None = None,
    limits: CpuLimits | None = None,
) -> list[tuple[bool, Any]]:
    """(returned, value) per call from the sandbox's lines; a missing call did not return.

    A second line for the same call means the candidate wrote into the channel: every call
    then counts as not returned. With `limits` (and each line's CPU time, `line_cpu`), the
    lines must come in the harness's order, "ready" then each call, and a call whose line came
    after more CPU time than its limit did not return.
    """
    lines = _parsed(stdout, line_cpu)
    if limits is not None:
        return _timed(lines, count, limits)
    seen: dict[int, tuple[bool, Any]] = {}
    budget = _Budget()
    for index, status, payload, _ in lines:
        if type(index) is not int or not 0 <= index < count:
            continue
        if index in seen:
            return [(False, None)] * count
        seen[index] = _value(status, payload, budget)
    return [seen.get(i, (False, None)) for i in range(count)]


def _parsed(stdout: str, line_cpu: Sequence[float] | None) -> list[tuple[Any, Any, Any, float]]:
    found = []
    for i, line in enumerate(stdout.split("\n")):
        try:
            index, status, payload = json.loads(line)
        except (ValueError, TypeError, RecursionError):
            continue
        cpu = line_cpu[i] if line_cpu is not None and i < len(line_cpu) else math.inf
        found.append((index, status, payload, cpu))
    return found


def _value(status: Any, payload: Any, budget: _Budget) -> tuple[bool, Any]:
    try:
        return (True, decode(payload, budget=budget)) if status == "ok" else (False, None)
    except (ValueError, TypeError, OverflowError, RecursionError):
        return (False, None)


def _timed(
    lines: list[tuple[Any, Any, Any, float]], count: int, limits: CpuLimits
) -> list[tuple[bool, Any]]:
    expected = [(-1, "ready")] + [(i, None) for i in range(count)]
    if len(lines) > len(expected) or not lines or lines[0][:2] != (-1, "ready"):
        return [(False, None)] * count
    if any(type(index) is not int or index != i - 1 for i, (index, *_) in enumerate(lines)):
        return [(False, None)] * count  # out of order, repeated or made up: nothing counts
    if lines[0][3] > limits.start_seconds:
        return [(False, None)] * count
    results = [(False, None)] * count
    budget = _Budget()
    for before, (index, status, payload, cpu) in itertools.pairwise(lines):
        if cpu - before[3] <= limits.call_seconds:
            results[index] = _value(status, payload, budget)
    return results


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
