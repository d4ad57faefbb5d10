"""Index expressions (sympy, over shape symbols and index variables) as source text. One walk serves both code
generators; each language says how it spells a constant, a name, floor division, modulo and min/max, and whether
it may use its native operators (C-style truncation is exact only when both sides are known non-negative)."""

from __future__ import annotations

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing


def nonnegative(e) -> bool:
    return bool(sympy.sympify(e).is_nonnegative)


class IndexText:
    """Call an instance on an expression to get its text; subclasses spell the leaves and operators."""

    def __call__(self, e) -> str:
        e = sympy.sympify(e)
        if e.is_Integer:
            return self.integer(int(e))
        if e.is_Symbol:
            return self.symbol(e.name)
        if isinstance(e, sympy.Add):
            return "(" + " + ".join(self(t) for t in sorted(e.args, key=sympy.default_sort_key)) + ")"
        if isinstance(e, sympy.Mul):
            return "(" + " * ".join(self(t) for t in e.args) + ")"
        if isinstance(e, FloorDiv):
            a, b = e.args
            return self.floordiv(self(a), self(b), nonnegative(a) and nonnegative(b))
        if isinstance(e, ModularIndexing):
            x, div, mod = e.args
            return self.mod(self.floordiv(self(x), self(div), nonnegative(x)), self(mod), nonnegative(x))
        if isinstance(e, sympy.Mod):
            a, b = e.args
            return self.mod(self(a), self(b), nonnegative(a))
        if isinstance(e, (sympy.Max, sympy.Min)):
            which = "max" if isinstance(e, sympy.Max) else "min"
            out = self(e.args[0])
            for a in e.args[1:]:
                out = self.extreme(which, out, self(a))
            return out
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "(" + " * ".join([self(e.base)] * int(e.exp)) + ")"
        if isinstance(e, sympy.floor) and isinstance(e.args[0], sympy.Mul):
            num, den = e.args[0].as_numer_denom()
            return self.floordiv(self(num), self(den), False)
        raise NotImplementedError(f"index expression {e} ({type(e).__name__})")

    def integer(self, v: int) -> str:
        return str(v)

    def symbol(self, name: str) -> str:
        raise NotImplementedError

    def floordiv(self, a: str, b: str, nonneg: bool) -> str:
        raise NotImplementedError

    def mod(self, a: str, b: str, nonneg: bool) -> str:
        raise NotImplementedError

    def extreme(self, which: str, a: str, b: str) -> str:
        raise NotImplementedError
