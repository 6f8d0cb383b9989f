"""The sandboxed side of a code test and the channel back from it: the program sent into the
sandbox (`harness`: the test imports, the candidate's code, then each call under its own alarm,
one line per call in a strict encoding of builtin values) and the parent's reading of those
lines (`read_results`: values rebuilt by `decode` with bounded work, each call judged by the CPU
time the parent measured when its line arrived). What a test checks and whether a value passes
is decided in stages/rewards/code_tests.py, never here and never in the sandbox."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_VALUE_DEPTH = 50


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
