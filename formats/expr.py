"""The expression form stored in a manifest for sizes, offsets, launch grids and guards.

An expression is JSON: an integer literal, a symbol name (a string), or a list ``[op, arg, ...]``.
The loader evaluates it here, over Python integers (no ``eval``), and every literal and every intermediate value
must fit in 64 signed bits: a hostile manifest cannot make evaluation run for minutes on huge products, and no
value a kernel receives (it takes int64 symbols) can wrap around. See formats/SPEC.md.

    ["+", a, b, ...]   sum                 ["*", a, b, ...]   product
    ["-", a, b]        difference          ["//", a, b]       floor division (b > 0)
    ["%", a, b]        floor modulo (b > 0)
    ["max", a, ...]    ["min", a, ...]
    ["==", a, b] ["!=", a, b] ["<", a, b] ["<=", a, b]        comparisons, 1 or 0
    ["and", a, ...] ["or", a, ...] ["not", a]                  logic over 0/1
"""

from __future__ import annotations

import re
from typing import Mapping, Union

from .errors import FormatError, clip

Expr = Union[int, str, list]

SYMBOL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_NARY = {"+", "*", "max", "min", "and", "or"}
_BINARY = {"-", "//", "%", "==", "!=", "<", "<="}
_UNARY = {"not"}
OPS = _NARY | _BINARY | _UNARY
MAX_DEPTH = 64
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1


def _bounded(v: int) -> int:
    if not INT_MIN <= v <= INT_MAX:
        raise FormatError(f"expression value {_short(v)} does not fit in 64 signed bits")
    return v


def _short(v: int) -> str:
    """A huge integer's sign and bit length: printing it in decimal is quadratic in its size."""
    return str(v) if v.bit_length() <= 64 else f"{'-' if v < 0 else ''}2^{v.bit_length() - 1}..."


def validate(expr: Expr, symbols: set[str] | None = None, where: str = "expression", _depth: int = 0) -> None:
    """Check that ``expr`` is well formed and only names known symbols; raise FormatError otherwise."""
    if _depth > MAX_DEPTH:
        raise FormatError(f"{where}: expression nests deeper than {MAX_DEPTH} levels")
    if isinstance(expr, bool) or not isinstance(expr, (int, str, list)):
        raise FormatError(f"{where}: expected an integer, a symbol name or [op, args...], found {_clip(expr)}")
    if isinstance(expr, str):
        if not SYMBOL_RE.match(expr):
            raise FormatError(f"{where}: {expr[:80]!r} is not a valid symbol name")
        if symbols is not None and expr not in symbols:
            raise FormatError(f"{where}: symbol {expr!r} is not declared in the manifest's symbols "
                              f"(declared: {sorted(symbols)})")
        return
    if isinstance(expr, int):
        if not INT_MIN <= expr <= INT_MAX:
            raise FormatError(f"{where}: integer {_short(expr)} does not fit in 64 signed bits")
        return
    if not expr or not isinstance(expr[0], str) or expr[0] not in OPS:
        raise FormatError(f"{where}: unknown operator in {_clip(expr)}; known: {sorted(OPS)}")
    op, args = expr[0], expr[1:]
    arity_ok = (len(args) >= 1 if op in _NARY else len(args) == 2 if op in _BINARY else len(args) == 1)
    if not arity_ok:
        raise FormatError(f"{where}: operator {op!r} got {len(args)} argument(s) in {_clip(expr)}")
    for a in args:
        validate(a, symbols, where, _depth + 1)


def _clip(value, limit: int = 120) -> str:
    """A value for a message, cut short: a hostile manifest's expression can be megabytes long."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _short(value)
    return clip(value, limit) if isinstance(value, (list, dict)) else repr(value)[:limit]


def evaluate(expr: Expr, env: Mapping[str, int]) -> int:
    """Evaluate a validated expression with symbol values from ``env``."""
    if isinstance(expr, int):
        return expr
    if isinstance(expr, str):
        try:
            return env[expr]
        except KeyError:
            raise FormatError(f"symbol {expr!r} has no value (bound: {sorted(env)})") from None
    op = expr[0]
    vals = [evaluate(a, env) for a in expr[1:]]
    if op == "+":
        return _bounded(sum(vals))
    if op == "*":
        return _product(vals)
    if op == "max":
        return max(vals)
    if op == "min":
        return min(vals)
    if op == "and":
        return int(all(vals))
    if op == "or":
        return int(any(vals))
    if op == "not":
        return int(not vals[0])
    a, b = vals
    if op == "-":
        return _bounded(a - b)
    if op in ("//", "%"):
        if b <= 0:
            raise FormatError(f"division by {b} while evaluating {to_text(expr)}")
        return a // b if op == "//" else a % b
    return int({"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b}[op])


def free_symbols(expr: Expr) -> set[str]:
    if isinstance(expr, str):
        return {expr}
    if isinstance(expr, list):
        out: set[str] = set()
        for a in expr[1:]:
            out |= free_symbols(a)
        return out
    return set()


_INFIX = {"+": " + ", "*": "*", "-": " - ", "//": " // ", "%": " % ",
          "==": " == ", "!=": " != ", "<": " < ", "<=": " <= ", "and": " and ", "or": " or "}


def to_text(expr: Expr) -> str:
    """Human-readable rendering, for messages and ``tcpkg inspect``."""
    if isinstance(expr, (int, str)):
        return str(expr)
    op, args = expr[0], [to_text(a) for a in expr[1:]]
    if op in ("max", "min"):
        return f"{op}({', '.join(args)})"
    if op == "not":
        return f"not ({args[0]})"
    wrapped = [a if isinstance(e, (int, str)) else f"({a})" for a, e in zip(args, expr[1:])]
    return _INFIX[op].join(wrapped)


def compile_expr(expr: Expr):
    """A validated expression as a closure ``env -> int``: the per-call path evaluates shapes and workspace
    sizes without walking the tree each time. Built from the tree with Python closures, never with ``eval``."""
    if isinstance(expr, int):
        return lambda env: expr
    if isinstance(expr, str):
        return lambda env: env[expr]
    op, args = expr[0], tuple(compile_expr(a) for a in expr[1:])
    if op == "+":
        return (lambda env: _bounded(args[0](env) + args[1](env))) if len(args) == 2 else \
            (lambda env: _bounded(sum(a(env) for a in args)))
    if op == "*":
        if len(args) == 2:
            return lambda env: _bounded(args[0](env) * args[1](env))
        return lambda env: _product(a(env) for a in args)
    if op in ("//", "%"):
        a, b = args
        return lambda env: _divide(op, a(env), b(env))
    fn = _COMPILED[op]  # validate() admits only known operators, and every one is compiled here
    return lambda env: fn([a(env) for a in args])


def _divide(op: str, a: int, b: int) -> int:
    if b <= 0:
        raise FormatError(f"division by {b} in a manifest expression")
    return a // b if op == "//" else a % b


def _product(values) -> int:
    """Checked after every factor, so no intermediate value grows past 64 bits (a chain of huge factors would
    otherwise take time quadratic in its digits)."""
    out = 1
    for v in values:
        out = _bounded(out * v)
    return out


_COMPILED = {
    "-": lambda v: _bounded(v[0] - v[1]), "max": max, "min": min,
    "==": lambda v: int(v[0] == v[1]), "!=": lambda v: int(v[0] != v[1]),
    "<": lambda v: int(v[0] < v[1]), "<=": lambda v: int(v[0] <= v[1]),
    "and": lambda v: int(all(v)), "or": lambda v: int(any(v)), "not": lambda v: int(not v[0]),
}
