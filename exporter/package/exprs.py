"""Sympy sizes and relations → the manifest's expression form (formats/expr.py)."""

from __future__ import annotations

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from tcexport.formats.errors import FormatError


def to_expr(e):
    """A sympy integer expression (or relation) as JSON: int, symbol name, or [op, args...]."""
    e = sympy.sympify(e)
    if e is sympy.true:
        return 1
    if e is sympy.false:
        return 0
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return e.name
    if isinstance(e, sympy.Add):
        return _sum(e)
    if isinstance(e, sympy.Mul):
        return ["*", *[to_expr(a) for a in sorted(e.args, key=sympy.default_sort_key)]]
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return ["*", *[to_expr(e.base)] * int(e.exp)]
    if isinstance(e, FloorDiv):
        return ["//", to_expr(e.args[0]), to_expr(e.args[1])]
    if isinstance(e, ModularIndexing):
        x, div, mod = e.args
        return ["%", ["//", to_expr(x), to_expr(div)], to_expr(mod)]
    if isinstance(e, sympy.Mod):
        return ["%", to_expr(e.args[0]), to_expr(e.args[1])]
    if isinstance(e, (sympy.Max, sympy.Min)):
        return ["max" if isinstance(e, sympy.Max) else "min", *[to_expr(a) for a in e.args]]
    rel = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<="}
    for cls, op in rel.items():
        if isinstance(e, cls):
            return [op, to_expr(e.lhs), to_expr(e.rhs)]
    if isinstance(e, sympy.Gt):
        return ["<", to_expr(e.rhs), to_expr(e.lhs)]
    if isinstance(e, sympy.Ge):
        return ["<=", to_expr(e.rhs), to_expr(e.lhs)]
    if isinstance(e, sympy.And):
        return ["and", *[to_expr(a) for a in e.args]]
    if isinstance(e, sympy.Or):
        return ["or", *[to_expr(a) for a in e.args]]
    if isinstance(e, sympy.Not):
        return ["not", to_expr(e.args[0])]
    raise FormatError(f"cannot store the expression {e} ({type(e).__name__}) in a manifest")


def _sum(e: sympy.Add):
    """Terms before the constant, and a negative constant as a difference: ``seq - 1``, not ``-1 + seq``."""
    const, rest = e.as_coeff_Add()
    terms = [to_expr(a) for a in sorted(sympy.Add.make_args(rest), key=sympy.default_sort_key)]
    body = terms[0] if len(terms) == 1 else ["+", *terms]
    if const == 0:
        return body
    return ["-", body, -int(const)] if const < 0 else (["+", *terms, int(const)])
