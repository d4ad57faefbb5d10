"""Lowering rules for ops that only backward graphs contain: convolution and max-pool backward, the
accumulating ``index_put`` an embedding's backward scatters with, the ``scatter`` of nll_loss's backward, and two
small helpers of decompositions.

Each is written as a gather, as every IR node is: an output element reads the elements that contribute to it.
A convolution's input gradient at h sums, over the kernel taps k, the output gradient at o = (h + p - k*d) / s
where that is a whole number inside the output; the other taps read a clamped (in-bounds) element and add 0.
A scatter-add into row v sums, over every index position, the value there if its index is v (cost: rows ×
positions; an IR scatter node would make it linear in the positions).
"""

from __future__ import annotations

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv

from . import ir
from .lower import register, torch_dtype_name
from .lower_conv import _and, _index, _ints, _last, _positions, window_load
from .lower_create import _filled
from .lower_index import _wrapped
from .lower_ops import _cast, _idx, _shape
from .lower_reduce import reduction

aten = torch.ops.aten


def _bounds(e, last: dict) -> tuple:
    """The smallest and largest value of an expression linear in the index variables (each in [0, last])."""
    e = sympy.expand(sympy.sympify(e))
    lo = hi = e.xreplace({v: 0 for v in last})
    for v, top in last.items():
        c = e.coeff(v)
        if c.is_positive:
            hi = hi + c * top
        elif c.is_negative:
            lo = lo + c * top
    return sympy.expand(lo), sympy.expand(hi)


def _tap(num, stride: int, size, last: dict) -> tuple:
    """The output position o = num / stride a kernel tap reads (clamped into [0, size)) and the conditions
    (IR bools) under which it is a real one: num divisible by stride and 0 <= o < size. Conditions that hold
    for every value of the variables are left out."""
    lo, hi = _bounds(num, last)
    conds = []
    o = num if stride == 1 else FloorDiv(num, stride)
    if stride != 1:
        conds.append(ir.Op("bool", "eq", (_index(sympy.Mod(num, stride)), ir.Const("int64", 0))))
    if not lo.is_nonnegative:
        conds.append(ir.Op("bool", "ge", (_index(num), ir.Const("int64", 0))))
        o = sympy.Max(o, 0)
    if not sympy.expand(size * stride - 1 - hi).is_nonnegative:
        conds.append(ir.Op("bool", "lt", (_index(num), _index(size * stride))))
        o = sympy.Min(o, size - 1)
    return o, conds


def _masked(cond, value: ir.Value, dtype: str) -> ir.Value:
    return value if cond is None else ir.Op(dtype, "where", (cond, value, ir.Const(dtype, 0)))


@register(aten.convolution_backward)
def _convolution_backward(low, node, val, grad_out, x, w, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    """(grad_input, grad_weight, grad_bias) of a convolution; None where output_mask says unused."""
    if transposed:
        raise NotImplementedError("backward of a transposed convolution")
    nsp = len(w.shape) - 2
    geo = (_ints(stride, nsp), _ints(padding, nsp), _ints(dilation, nsp))
    results = [None, None, None]
    if output_mask[0]:
        results[0] = _conv_grad_input(low, val[0], grad_out, w, geo, groups)
    if output_mask[1]:
        results[1] = _conv_grad_weight(low, val[1], grad_out, x, w, geo, groups)
    if output_mask[2]:
        results[2] = _conv_grad_bias(low, val[2], grad_out, nsp)
    return results


def _conv_grad_input(low, val, grad_out, w, geo, groups):
    """gx[n, c, h...] = sum over (co of c's group, k...) of gout[n, co, (h + p - k*d) / s] * w[co, c % Cg, k...]."""
    stride, padding, dilation = geo
    shape, out = _shape(low, val), torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    nsp = len(w.shape) - 2
    lead = len(shape) - nsp - 1
    cg, cog = w.shape[1], w.shape[0] // groups
    c = ir.ivar(lead)
    co = ir.rvar(0) if groups == 1 else FloorDiv(c, cg) * cog + ir.rvar(0)
    ci = c if groups == 1 else c - FloorDiv(c, cg) * cg
    h_vars = [ir.ivar(lead + 1 + d) for d in range(nsp)]
    k_vars = [ir.rvar(1 + d) for d in range(nsp)]
    last = _last(h_vars, shape[lead + 1:], k_vars, w.shape[2:])
    taps, conds = [], []
    for d in range(nsp):
        o, cond = _tap(h_vars[d] + padding[d] - k_vars[d] * dilation[d], stride[d], grad_out.shape[lead + 1 + d], last)
        taps.append(o)
        conds += cond
    g = _cast(grad_out.load([ir.ivar(0)] * lead + [co] + taps), acc)
    body = ir.Op(acc, "mul", (g, _cast(w.load([co, ci] + k_vars), acc)))
    total = reduction(low, shape, acc, "sum", [cog] + list(w.shape[2:]), _masked(_and(conds), body, acc))
    return total if acc == out else low.pointwise(shape, out, _cast(total.load(_idx(len(shape))), out))


def _conv_grad_weight(low, val, grad_out, x, w, geo, groups):
    """gw[co, ci, k...] = sum over (n, o...) of gout[n, co, o...] * x[n, g*Cg + ci, o*s - p + k*d]."""
    stride, padding, dilation = geo
    shape, out = _shape(low, val), torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    nsp = len(w.shape) - 2
    lead = len(x.shape) - nsp - 1
    cg, cog = w.shape[1], w.shape[0] // groups
    co, ci = ir.ivar(0), ir.ivar(1)
    cin = ci if groups == 1 else FloorDiv(co, cog) * cg + ci
    o_vars = [ir.rvar(lead + d) for d in range(nsp)]
    k_vars = [ir.ivar(2 + d) for d in range(nsp)]
    o_sizes = list(grad_out.shape[lead + 1:])
    last = _last(o_vars, o_sizes, k_vars, w.shape[2:])
    batch = [ir.rvar(0)] * lead
    xv = window_load(x, batch + [cin], _positions(o_vars, k_vars, stride, padding, dilation), 0, acc, last)
    g = _cast(grad_out.load(batch + [co] + o_vars), acc)
    ranges = list(grad_out.shape[:lead]) + o_sizes
    total = reduction(low, shape, acc, "sum", ranges, ir.Op(acc, "mul", (g, xv)))
    return total if acc == out else low.pointwise(shape, out, _cast(total.load(_idx(len(shape))), out))


def _conv_grad_bias(low, val, grad_out, nsp: int):
    """gb[co] = sum over every other dim of gout."""
    shape, out = _shape(low, val), torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    lead = len(grad_out.shape) - nsp - 1
    rest = [d for d in range(len(grad_out.shape)) if d != lead]
    idx, r = [], 0
    for d in range(len(grad_out.shape)):
        if d == lead:
            idx.append(ir.ivar(0))
        else:
            idx.append(ir.rvar(r))
            r += 1
    total = reduction(low, shape, acc, "sum", [grad_out.shape[d] for d in rest], _cast(grad_out.load(idx), acc))
    return total if acc == out else low.pointwise(shape, out, _cast(total.load(_idx(len(shape))), out))


@register(aten.max_pool2d_with_indices_backward)
def _max_pool2d_backward(low, node, val, grad_out, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """gx[.., h, w] = sum over the window taps (kh, kw) of gout[.., oh, ow] where (oh, ow) is the window that
    tap belongs to and its recorded argmax (``indices``, a flat position in the plane) is (h, w)."""
    kernel = _ints(kernel_size, 2)
    stride, padding, dilation = _ints(stride, 2) or kernel, _ints(padding, 2), _ints(dilation, 2)
    shape, out = _shape(low, val), torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    lead = len(shape) - 2
    h_vars = [ir.ivar(lead + d) for d in range(2)]
    k_vars = [ir.rvar(d) for d in range(2)]
    last = _last(h_vars, shape[lead:], k_vars, kernel)
    taps, conds = [], []
    for d in range(2):
        o, cond = _tap(h_vars[d] + padding[d] - k_vars[d] * dilation[d], stride[d], grad_out.shape[lead + d], last)
        taps.append(o)
        conds += cond
    at = [ir.ivar(k) for k in range(lead)] + taps
    flat = _index(h_vars[0] * shape[lead + 1] + h_vars[1])
    conds.append(ir.Op("bool", "eq", (ir.Op("int64", "cast", (indices.load(at),)) if indices.dtype != "int64"
                                      else indices.load(at), flat)))
    body = _masked(_and(conds), _cast(grad_out.load(at), acc), acc)
    total = reduction(low, shape, acc, "sum", kernel, body)
    return total if acc == out else low.pointwise(shape, out, _cast(total.load(_idx(len(shape))), out))


@register(aten.index_put)
def _index_put(low, node, val, base, indices, values, accumulate=False):
    """``base.index_put([idx], values, accumulate=True)``: row v of the result is base's row v plus the sum of
    the value rows whose index is v (negative indices wrap). The only form backward graphs produce (an
    embedding's weight gradient); other forms are not lowered."""
    if not accumulate or len(indices) != 1 or indices[0] is None:
        raise NotImplementedError("index_put other than accumulating with one index tensor on dim 0")
    idx = indices[0]
    shape, out = _shape(low, val), torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    p, rest = len(idx.shape), len(shape) - 1
    r_vars = [ir.rvar(k) for k in range(p)]
    target = list(idx.shape) + list(shape[1:])
    position = r_vars + [ir.ivar(1 + d) for d in range(rest)]
    offset = len(target) - len(values.shape)
    v_idx = [sympy.Integer(0) if size == 1 and target[d + offset] != 1 else position[d + offset]
             for d, size in enumerate(values.shape)]
    hit = ir.Op("bool", "eq", (_wrapped(idx.load(r_vars), shape[0]), _index(ir.ivar(0))))
    body = _masked(hit, _cast(values.load(v_idx), acc), acc)
    total = reduction(low, shape, acc, "sum", list(idx.shape), body).load(_idx(len(shape)))
    result = ir.Op(acc, "add", (_cast(base.load(_idx(len(shape))), acc), total))
    return low.pointwise(shape, out, _cast(result, out))


@register(aten.bitwise_not)
def _bitwise_not(low, node, val, x):
    """``~x``: logical not for bool (the masks decompositions build), all bits flipped for integers."""
    shape, out = _shape(low, val), torch_dtype_name(val.dtype)
    v = x.load(_idx(len(shape)))
    body = ir.Op("bool", "logical_not", (v,)) if out == "bool" else ir.Op(out, "bitxor", (v, ir.Const(out, -1)))
    return low.pointwise(shape, out, body)


@register(aten.empty_permuted)
def _empty_permuted(low, node, val, *args, **kw):
    """An uninitialised tensor (a decomposition fills it next): zeros, like the other ``empty`` ops."""
    return _filled(low, val, 0)


@register(aten.scatter)
def _scatter(low, node, val, base, dim, index, value=None, *rest, **kw):
    """``base.scatter(dim, index, value)`` with a scalar value (what nll_loss's backward builds): element i is
    ``value`` where some index entry along ``dim`` at i's other coordinates names i's position, else base's."""
    if node.target is not aten.scatter.value or rest or kw:
        raise NotImplementedError("scatter other than scatter(dim, index, scalar value)")
    shape, out = _shape(low, val), torch_dtype_name(val.dtype)
    rank = len(shape)
    dim %= max(rank, 1)
    for d in range(rank):
        if d != dim and not ir.same_size(index.shape[d], shape[d]):
            raise NotImplementedError("scatter with an index smaller than the tensor outside the scattered dim")
    at = [ir.rvar(0) if d == dim else ir.ivar(d) for d in range(rank)]
    entry = index.load(at)
    entry = entry if entry.dtype == "int64" else ir.Op("int64", "cast", (entry,))
    hit = ir.Op("bool", "eq", (_wrapped(entry, shape[dim]), _index(ir.ivar(dim))))
    any_hit = reduction(low, shape, "bool", "max", [index.shape[dim]], hit).load(_idx(rank))
    body = ir.Op(out, "where", (any_hit, ir.Const(out, value), base.load(_idx(rank))))
    return low.pointwise(shape, out, body)
