"""A view's division chains simplified knowing each index variable's range (schedule/fuse.simplify_in_ranges): the
heads of GPT-2's fused projection, read as the attention kernel's keys. torch 2.11's simplifier kept
``(d + 16*n + 16*seq*b) // (16*seq)`` whole, a division per element of every GPU load of K; the fallback rule
takes it apart on every torch, and only where the remainder stays below the divisor."""

from __future__ import annotations

import itertools

import pytest
import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from tcexport.exporter.ir.loops import ivar, shape_symbol
from tcexport.exporter.schedule.fuse import _divisions_in_ranges, simplify_in_ranges

SEQ, BATCH = shape_symbol("s_seq"), shape_symbol("s_batch")
BH, D, N = ivar(0), ivar(1), ivar(2)  # (batch, head), a feature of the head, a token
FLAT = D + 16 * N + 16 * BH * SEQ
KEYS = 64 + D + 192 * N + 192 * SEQ * FloorDiv(FLAT, 64 * SEQ) + 16 * ModularIndexing(FLAT, 16 * SEQ, 4)


@pytest.mark.parametrize("simplify", [_divisions_in_ranges, simplify_in_ranges])
def test_the_key_view_divides_only_the_programs_index(simplify):
    got = simplify(KEYS, {BH: 4 * BATCH, N: SEQ, D: 16})
    divided = [a.args[0] for a in sympy.preorder_traversal(got) if isinstance(a, (FloorDiv, ModularIndexing))]
    assert divided and all(x == BH for x in divided), got
    for b, s, bh, d, n in itertools.product([1, 3], [1, 5], range(12), [0, 7, 15], [0, 4]):
        if bh < 4 * b and n < s:
            point = {BATCH: b, SEQ: s, BH: bh, D: d, N: n}
            assert _value(got, point) == _value(KEYS, point)


def test_a_remainder_that_can_reach_the_divisor_keeps_the_division():
    """One more token than the view has: (d + 16*n) may reach 16*seq, and b is then not the quotient."""
    got = _divisions_in_ranges(KEYS, {BH: 4 * BATCH, N: SEQ + 1, D: 16})
    assert got.has(FloorDiv) and any(isinstance(a, FloorDiv) and a.args[1] == 64 * SEQ
                                     for a in sympy.preorder_traversal(got))


def _value(e, point) -> int:
    def ev(v):
        if isinstance(v, FloorDiv):
            return ev(v.args[0]) // ev(v.args[1])
        if isinstance(v, ModularIndexing):
            return ev(v.args[0]) // ev(v.args[1]) % ev(v.args[2])
        if v.is_Symbol:
            return point[v]
        if v.is_Number:
            return int(v)
        args = [ev(a) for a in v.args]
        if isinstance(v, sympy.Add):
            return sum(args)
        if isinstance(v, sympy.Mul):
            out = 1
            for a in args:
                out *= a
            return out
        if isinstance(v, sympy.Pow):
            return args[0] ** args[1]
        raise TypeError(v)
    return ev(sympy.sympify(e))
