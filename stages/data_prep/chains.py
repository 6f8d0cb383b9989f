"""Exact worked chains for integer arithmetic expressions (SourceSpec `reasoning: steps`).

Why: reasoning-gym's arithmetic rows carry the expression and its value but no working, so
their SFT target's reasoning was the one line "<expression> = <answer>": the model learns to
jump to an answer, and RL has no chain to reshape (why worked chains exist). A chain written by the
task's own rules is exact, free and deterministic, unlike a model's traces.

The expression is parsed with `ast` (never evaluated) and reduced innermost-first, left to
right, one operation per step, in the precedence the expression's grammar gives:
"-( ( -7 - 3 ) )" -> "-7 - 3 = -10. -(-10) = 10." A negative right operand is written in
parentheses ("3 - (-7) = 10"); a negation is written "-(x) = y". Division follows
reasoning-gym's own answers (Python floor division); a division that is not exact says so:
"-1 / 27 = -1 (rounded down)". Only integer literals, + - * / and unary minus are read; any
other expression (decimals, names, powers, ...) is refused with the reason, and so is a chain
whose last value is not the row's answer: the caller quarantines that row.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

ROUNDED = " (rounded down)"
_SYMBOLS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
}
MAX_EXPRESSION_CHARS = 1000  # far beyond any generator's; a longer text is not parsed
MAX_DEPTH = 100  # operations nested in one another; deeper is refused, not left to the stack


class NotAChain(ValueError):
    """An expression this module cannot reduce exactly; the message says why."""


@dataclass(frozen=True)
class Step:
    """One operation: `left op right = value`, or a negation (op "neg", left None)."""

    op: str
    left: int | None
    right: int
    value: int

    def text(self) -> str:
        if self.op == "neg":
            return f"-({self.right}) = {self.value}."
        rounded = ROUNDED if self.op == "/" and self.left != self.value * self.right else ""
        right = f"({self.right})" if self.right < 0 else str(self.right)
        return f"{self.left} {self.op} {right} = {self.value}{rounded}."


def steps(expression: str) -> tuple[list[Step], int]:
    """(the steps, the value) of an integer expression; NotAChain if it is not one."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise NotAChain(
            f"expression of {len(expression)} characters; at most {MAX_EXPRESSION_CHARS}"
        )
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise NotAChain(f"expression {expression[:60]!r} does not parse: {e}") from e
    out: list[Step] = []
    try:
        value = _reduce(tree.body, out, 0)
    except RecursionError as e:  # the depth check comes first; this is the stack's own limit
        raise NotAChain(f"expression {expression[:60]!r} is nested too deeply") from e
    return out, value


def chain(expression: str) -> tuple[str, int]:
    """(the worked chain as text, its last value). An expression that is one number has no
    operation: its chain is the number itself ("7.")."""
    out, value = steps(expression)
    return (" ".join(step.text() for step in out) if out else f"{value}."), value


def _reduce(node: ast.expr, out: list[Step], depth: int) -> int:
    """The node's value; each operation under it appended to `out` innermost-first."""
    if depth > MAX_DEPTH:
        raise NotAChain(f"operations nested more than {MAX_DEPTH} deep")
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        if isinstance(node.operand, ast.Constant) and type(node.operand.value) is int:
            return -node.operand.value  # a negative literal, not an operation
        inner = _reduce(node.operand, out, depth + 1)
        out.append(Step("neg", None, inner, -inner))
        return -inner
    if isinstance(node, ast.BinOp) and type(node.op) in _SYMBOLS:
        left, right = _reduce(node.left, out, depth + 1), _reduce(node.right, out, depth + 1)
        symbol = _SYMBOLS[type(node.op)]
        out.append(Step(symbol, left, right, _apply(symbol, left, right)))
        return out[-1].value
    raise NotAChain(f"{ast.unparse(node)[:60]!r} is not an integer, + - * /, or unary minus")


def _apply(symbol: str, left: int, right: int) -> int:
    if symbol == "+":
        return left + right
    if symbol == "-":
        return left - right
    if symbol == "*":
        return left * right
    if right == 0:
        raise NotAChain(f"division by zero: {left} / 0")
    return left // right  # reasoning-gym's answers divide with Python's //
