"""Upper bounds of size expressions over the shape symbols' ranges: what the schedule (split-K's row bound) and
the CUDA tiles (tile sides, index widths) decide from, so both read one definition."""

from __future__ import annotations

import sympy

from tcexport.exporter.ir import loops as ir

INT32_LIMIT = 2**31 - 1


def symbol_bounds(prog: ir.Program) -> dict:
    return {sympy.Symbol(s.name, integer=True, positive=True): s.max for s in prog.symbols}


def upper_bound(e, bounds: dict) -> int | None:
    """The largest value of a size expression over the symbols' ranges (sizes are monotone in the symbols),
    or None when a symbol has no upper bound."""
    e = sympy.sympify(e)
    subs = {}
    for s in e.free_symbols:
        hi = bounds.get(s)
        if hi is None:
            return None
        subs[s] = hi
    try:
        return int(sympy.ceiling(e.xreplace(subs)))
    except TypeError:
        return None


def lower_bound(e, prog: ir.Program) -> int:
    """The smallest value of a size expression over the symbols' ranges (sizes are monotone in the symbols)."""
    e = sympy.sympify(e)
    mins = {sympy.Symbol(s.name, integer=True, positive=True): s.min for s in prog.symbols}
    try:
        return int(sympy.floor(e.xreplace({s: mins.get(s, 1) for s in e.free_symbols})))
    except TypeError:
        return 1


def index_bits(prog: ir.Program, buffers=None) -> int:
    """32-bit index arithmetic when every buffer a kernel touches provably has fewer than 2**31 elements (over
    the symbols' ranges), else 64-bit. Decided per kernel: one huge buffer (GPT-2's logits at the largest
    batch and sequence) must not slow every other kernel down."""
    bounds = symbol_bounds(prog)
    for name in (prog.buffers if buffers is None else buffers):
        hi = upper_bound(prog.buffers[name].numel(), bounds)
        if hi is None or hi > INT32_LIMIT:
            return 64
    return 32
