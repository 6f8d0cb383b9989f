"""Math answers graded by math-verify in two sandboxes, so that no answer sees its reference.

math-verify (with latex2sympy2-extended) understands LaTeX and plain answers: `\\boxed{}`,
`\\frac34`, tuples and intervals, `x=5` against `5`, sets in any order. Parsing an answer may
evaluate it (SymPy's parser calls eval), so it happens only in a sandbox:

1. parse: one sandbox per answer receives only the answer and writes back its parse as a
   plain tree (JSON of class names and numbers/strings). The reference is not there to read.
2. verify: one sandbox per (tree, reference) pair rebuilds the answer from the tree, using only
   a fixed list of SymPy classes (nothing is parsed or evaluated from model text there), parses
   the reference and prints math-verify's verdict.

Each answer has its own processes and time limits, so a hostile or slow answer costs only its
own score. The trainer's process only reads the two small JSON outputs.

A reference that is words, not mathematics (`is_text_answer`), never comes here: it is graded
by plain comparison in the grading process, which costs nothing and, unlike SymPy, does not
read a word as a product of letters (equal to its anagrams).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from stages.rewards.confinement import Isolation, Limits
from stages.rewards.sandbox import SandboxResult, run_many

MATH_LIMITS = Limits(
    cpu_seconds=4,
    wall_seconds=30,  # a backstop for a blocked process; the CPU limit is the real one
    site_packages=True,
    preload=("sympy", "math_verify", "latex2sympy2_extended"),
)

_PARSE_TEXT = r"""
import logging
logging.disable(logging.WARNING)  # math-verify warns that its own timeouts are off

def _parse_any(text):
    from math_verify import parse
    text = text.strip()
    found = parse("$" + text.strip("$") + "$", parsing_timeout=None)
    return found if found else parse(text, parsing_timeout=None)
"""

PARSE = (
    _PARSE_TEXT
    + r"""
import json, sympy
_answer = json.loads(DATA)

def _tree(e, depth=0):
    if depth > 200:
        raise ValueError("too deep")
    if isinstance(e, str):
        return ["str", e]
    if e is sympy.true or e is sympy.false:
        return ["bool", bool(e)]
    if isinstance(e, sympy.Integer):
        return ["Integer", str(int(e))]
    if isinstance(e, sympy.Rational):
        return ["Rational", str(e.p), str(e.q)]
    if isinstance(e, sympy.Float):
        return ["Float", str(e), int(e._prec)]
    if isinstance(e, sympy.Symbol):
        facts = {k: v for k, v in e._assumptions_orig.items() if type(v) is bool}
        return ["Symbol", e.name, facts]
    if isinstance(e, sympy.Basic) and not e.args:
        return ["S", type(e).__name__]
    if isinstance(e, sympy.Basic):
        return ["F", type(e).__name__, [_tree(a, depth + 1) for a in e.args]]
    raise TypeError(type(e).__name__)

print(json.dumps([_tree(x) for x in _parse_any(_answer)]))
"""
)

VERIFY = (
    _PARSE_TEXT
    + r"""
import json, sympy
from math_verify import verify
_data = json.loads(DATA)
_CLASSES = {name: getattr(sympy, name) for name in FUNCTIONS}
_singletons = SINGLETONS
_FACTS = {"real", "integer", "positive", "negative", "nonnegative", "nonpositive", "complex",
          "rational", "finite", "commutative", "zero", "nonzero", "imaginary", "extended_real"}

def _build(n, depth=0):
    if depth > 200 or type(n) is not list or not n:
        raise ValueError("malformed tree")
    tag = n[0]
    if tag == "str":
        return str(n[1])
    if tag == "bool":
        return sympy.true if n[1] is True else sympy.false
    if tag == "Integer" and len(n[1]) < 1000:
        return sympy.Integer(int(n[1]))
    if tag == "Rational" and len(n[1]) + len(n[2]) < 1000:
        return sympy.Rational(int(n[1]), int(n[2]))
    if tag == "Float" and len(n[1]) < 1000:
        return sympy.Float(n[1], precision=int(n[2]))
    if tag == "Symbol" and type(n[1]) is str and type(n[2]) is dict:
        facts = {k: v for k, v in n[2].items() if k in _FACTS and type(v) is bool}
        return sympy.Symbol(n[1], **facts)
    if tag == "S" and n[1] in _singletons:
        return getattr(sympy.S, n[1])
    if tag == "F" and n[1] in _CLASSES:
        return _CLASSES[n[1]](*[_build(a, depth + 1) for a in n[2]])
    raise ValueError("not an allowed node: " + str(tag) + " " + str(n[1])[:40])

_answer = [_build(n) for n in _data["tree"]]
_gold = _parse_any(_data["reference"])
print(json.dumps(bool(_answer) and bool(verify(_gold, _answer, timeout_seconds=None))))
"""
)

# SymPy classes a parsed answer may be rebuilt from (anything else: not equivalent).
FUNCTIONS = (
    "Add",
    "Mul",
    "Pow",
    "Interval",
    "FiniteSet",
    "Tuple",
    "Union",
    "Intersection",
    "Complement",
    "ProductSet",
    "Equality",
    "Unequality",
    "StrictLessThan",
    "LessThan",
    "StrictGreaterThan",
    "GreaterThan",
    "And",
    "Or",
    "Not",
    "sin",
    "cos",
    "tan",
    "cot",
    "sec",
    "csc",
    "asin",
    "acos",
    "atan",
    "acot",
    "sinh",
    "cosh",
    "tanh",
    "log",
    "exp",
    "Abs",
    "factorial",
    "binomial",
    "floor",
    "ceiling",
    "Min",
    "Max",
    "re",
    "im",
    "Mod",
    "conjugate",
    "sign",
)
SINGLETONS = (
    "Pi",
    "Exp1",
    "ImaginaryUnit",
    "Infinity",
    "NegativeInfinity",
    "ComplexInfinity",
    "NaN",
    "EmptySet",
    "Reals",
    "Naturals",
    "Naturals0",
    "Integers",
    "Complexes",
    "EulerGamma",
    "GoldenRatio",
    "Catalan",
)


# Characters that make a reference mathematics rather than text
_MATH_MARKS = frozenset("0123456789\\^_{}=<>+-*/()[]|")


def is_text_answer(reference: str) -> bool:
    """True for a reference that is words, not mathematics: letters, with no digit and none of
    `\\ ^ _ { } = < > + - * / ( ) [ ] |` (a reversed word, a name, a yes/no, a choice letter).

    Such an answer is graded by plain comparison in the grading process, never by math-verify
    in the sandbox: SymPy would read a word as a product of one-letter symbols, so the word
    and its anagrams would be the same answer, and each answer would cost two processes."""
    text = reference.strip()
    return any(c.isalpha() for c in text) and not any(c in _MATH_MARKS for c in text)


@dataclass
class MathRuns:
    """How the sandboxed math checks went: processes started and failed (scored 0)."""

    runs: int = 0
    failures: int = 0


def _program(template: str, data: object) -> str:
    return (
        template.replace("FUNCTIONS", repr(FUNCTIONS))
        .replace("SINGLETONS", repr(SINGLETONS))
        .replace("DATA", repr(json.dumps(data)))
    )


def _last_json(result: SandboxResult) -> object:
    if not result.ok:
        return None
    lines = result.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else None
    except (ValueError, RecursionError):
        return None


def symbolic_verdicts(
    pairs: Sequence[tuple[str, str]],
    isolation: Isolation,
    runs: MathRuns,
    workers: int | None = None,
) -> list[bool]:
    """math-verify's verdict per (answer, reference): parse and verify in separate sandboxes."""
    parsed = run_many([_program(PARSE, a) for a, _ in pairs], MATH_LIMITS, isolation, workers)
    trees = [_last_json(r) for r in parsed]
    runs.runs += len(parsed)
    runs.failures += sum(1 for t in trees if not isinstance(t, list))
    todo = [i for i, t in enumerate(trees) if isinstance(t, list) and t]
    programs = [_program(VERIFY, {"tree": trees[i], "reference": pairs[i][1]}) for i in todo]
    verified = run_many(programs, MATH_LIMITS, isolation, workers)
    runs.runs += len(verified)
    verdicts = [False] * len(pairs)
    for i, result in zip(todo, verified, strict=True):
        verdict = _last_json(result)
        runs.failures += 0 if isinstance(verdict, bool) else 1
        verdicts[i] = verdict is True
    return verdicts
