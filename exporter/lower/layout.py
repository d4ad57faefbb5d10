"""Lowering rules for ops that place a tensor's elements by index ranges: constant padding, repeat, flip,
slice_scatter. Repeat and flip are views (index arithmetic, no node); padding and scatters are one pointwise
node each, a select between sources whose loads are clamped so the branch not taken never reads out of range.
"""

from __future__ import annotations

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower.rules import RuleTable
from tcexport.exporter.lower.context import torch_dtype_name
from tcexport.exporter.lower.values import cast, index_value, ivars, shape_of, value_at, view_of

aten = torch.ops.aten
RULES = RuleTable("tcexport.exporter.lower.layout")


def _in_range(pos, lo, hi) -> list:
    """Conditions (IR values) for lo <= pos < hi, leaving out those that always hold."""
    conds = []
    if sympy.sympify(lo) != 0 or not sympy.sympify(pos).is_nonnegative:
        conds.append(ir.Op("bool", "ge", (index_value(pos), index_value(lo))))
    conds.append(ir.Op("bool", "lt", (index_value(pos), index_value(hi))))
    return conds


def _all(conds):
    out = conds[0]
    for c in conds[1:]:
        out = ir.Op("bool", "logical_and", (out, c))
    return out


@RULES.rule(aten.constant_pad_nd)
def _constant_pad(low, node, val, x, pad, value=0):
    """pad = (lo, hi) pairs from the last dim backwards; negative amounts crop."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    rank = len(shape)
    idx, conds = list(ivars(rank)), []
    for k in range(len(pad) // 2):
        d = rank - 1 - k
        lo = sympy.sympify(pad[2 * k])
        src = ir.ivar(d) - lo
        if lo > 0:
            conds.append(ir.Op("bool", "ge", (index_value(ir.ivar(d)), index_value(lo))))
        if sympy.sympify(pad[2 * k + 1]) > 0:
            conds.append(ir.Op("bool", "lt", (index_value(src), index_value(x.shape[d]))))
        idx[d] = sympy.Max(0, sympy.Min(src, x.shape[d] - 1)) if lo > 0 or pad[2 * k + 1] > 0 else src
    v = cast(x.load(idx), out)
    if not conds:
        return low.pointwise(shape, out, v)
    return low.pointwise(shape, out, ir.Op(out, "where", (_all(conds), v, value_at(value, shape, out))))


@RULES.rule(aten.repeat)
def _repeat(low, node, val, x, repeats):
    """out[..., i, ...] = x[..., i mod size, ...]; extra leading dims repeat the whole tensor."""
    shape = shape_of(low, val)
    off = len(shape) - len(x.shape)
    idx = []
    for d, size in enumerate(x.shape):
        i = ir.ivar(d + off)
        plain = repeats[d + off] == 1 or size == 0  # size 0: there is no element to place
        idx.append(sympy.Integer(0) if size == 1 else i if plain else ModularIndexing(i, 1, size))
    return view_of(x, shape, idx)


@RULES.rule(aten.flip)
def _flip(low, node, val, x, dims):
    rank = len(x.shape)
    dims = {d % rank for d in dims}
    return view_of(x, x.shape, [x.shape[d] - 1 - ir.ivar(d) if d in dims else ir.ivar(d) for d in range(rank)])


@RULES.rule(aten.slice_scatter)
def _slice_scatter(low, node, val, x, src, dim=0, start=None, end=None, step=1):
    """x with x[..., start:end:step, ...] replaced by src: where the position is in the slice, read src."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    rank = len(shape)
    dim %= rank
    size = x.shape[dim]
    start = sympy.sympify(0 if start is None else start)
    end = sympy.sympify(size if end is None else end)
    start = start + size if start.is_negative else start
    end = end + size if end.is_negative else end
    start, end = sympy.Min(start, size), sympy.Min(end, size)
    n = src.shape[dim]
    i = ir.ivar(dim)
    conds = _in_range(i, start, end) if n != 0 else []
    if not conds:
        return low.pointwise(shape, out, cast(x.load(ivars(rank)), out))
    if step != 1:
        conds.append(ir.Op("bool", "eq", (index_value(ModularIndexing(i - start + step * size, 1, step)),
                                          ir.Const("int64", 0))))
    local = FloorDiv(i - start, step) if step != 1 else i - start
    sidx = [sympy.Max(0, sympy.Min(local, n - 1)) if d == dim else ir.ivar(d) for d in range(rank)]
    body = ir.Op(out, "where", (_all(conds), cast(src.load(sidx), out), cast(x.load(ivars(rank)), out)))
    return low.pointwise(shape, out, body)


@RULES.rule(aten.as_strided)
def _as_strided(low, node, val, x, size, stride, storage_offset=None):
    """A strided view of x's elements in row-major order (decompositions use it on contiguous results, e.g.
    group norm); x is made contiguous first when it is a view."""
    shape = shape_of(low, val)
    if any(s == 0 for s in x.shape):  # nothing to read
        return view_of(x, shape, [sympy.Integer(0)] * len(x.shape))
    if not x.is_identity():
        x = low.realize(x)
    flat = sympy.sympify(storage_offset or 0) + sum((ir.ivar(k) * s for k, s in enumerate(stride)), sympy.Integer(0))
    idx, acc = [], sympy.Integer(1)
    for size_d in reversed(x.shape):
        idx.append(sympy.Integer(0) if size_d == 1 else ModularIndexing(flat, acc, size_d))
        acc = acc * size_d
    idx.reverse()
    if idx and x.shape[0] != 1:
        idx[0] = FloorDiv(flat, acc / x.shape[0])
    return view_of(x, shape, idx)
