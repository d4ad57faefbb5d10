"""Lowering rules for the backward of convolution and max pooling.

A convolution's weight gradient is a GEMM over every (batch, output position): the output gradient (as [Cout,
N*O]) times the input's patches (im2col, [N*O, Cin*K], zero where the window reads padding). Its input gradient
is a GEMM per batch element, W^T [Cin*K, Cout] times the output gradient [Cout, O], giving each input patch's
gradient, then a gather (col2im): input position h sums, over the kernel taps k, the patch gradient at output
o = (h + p - k*d) / s where that is a whole number inside the output; the other taps read a clamped (in-bounds)
element and add 0. Grouped convolutions use the same gathers as loops (no GEMM). A max pool's input gradient
is the same gather over the window taps, keeping the taps whose recorded argmax is this position.
"""

from __future__ import annotations

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower.rules import RuleTable
from tcexport.exporter.lower.context import TensorRef, identity_ref, torch_dtype_name
from tcexport.exporter.lower.conv import ints, window_last, window_load, window_positions
from tcexport.exporter.lower.reduce import reduction
from tcexport.exporter.lower.values import all_of, cast, index_value, ivars, shape_of

aten = torch.ops.aten
RULES = RuleTable("tcexport.exporter.lower.grad_conv")


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
        conds.append(ir.Op("bool", "eq", (index_value(sympy.Mod(num, stride)), ir.Const("int64", 0))))
    if not lo.is_nonnegative:
        conds.append(ir.Op("bool", "ge", (index_value(num), ir.Const("int64", 0))))
        o = sympy.Max(o, 0)
    if not sympy.expand(size * stride - 1 - hi).is_nonnegative:
        conds.append(ir.Op("bool", "lt", (index_value(num), index_value(size * stride))))
        o = sympy.Min(o, size - 1)
    return o, conds


def _taps(h_vars, k_vars, geo, o_sizes, last: dict) -> tuple[list, list]:
    """For each spatial dim, the output position whose window puts tap k on input position h (see _tap), and
    the conditions under which there is one."""
    stride, padding, dilation = geo
    taps, conds = [], []
    for d, (h, k) in enumerate(zip(h_vars, k_vars)):
        o, cond = _tap(h + padding[d] - k * dilation[d], stride[d], o_sizes[d], last)
        taps.append(o)
        conds += cond
    return taps, conds


def _rounded(low, ref: TensorRef, out: str) -> TensorRef:
    """A gradient accumulated in its compute dtype, as the ``out`` dtype (16-bit floats rounded once, here)."""
    return ref if ref.dtype == out else low.pointwise(ref.shape, out, cast(ref.load(ivars(len(ref.shape))), out))


def masked(cond, value: ir.Value, dtype: str) -> ir.Value:
    return value if cond is None else ir.Op(dtype, "where", (cond, value, ir.Const(dtype, 0)))


@RULES.rule(aten.convolution_backward)
def _convolution_backward(low, node, val, grad_out, x, w, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    """(grad_input, grad_weight, grad_bias) of a convolution; None where output_mask says unused."""
    if transposed:
        raise NotImplementedError("backward of a transposed convolution")
    nsp = len(w.shape) - 2
    geo = (ints(stride, nsp), ints(padding, nsp), ints(dilation, nsp))
    results = [None, None, None]
    gemm = groups == 1 and ir.compute_dtype(torch_dtype_name(val[0 if output_mask[0] else 1].dtype)) in (
        "float32", "float64") if (output_mask[0] or output_mask[1]) else False
    if gemm:  # GEMM operands are whole contiguous buffers
        grad_out = grad_out if grad_out.is_identity() else low.realize(grad_out)
        w = w if w.is_identity() else low.realize(w)
    if output_mask[0]:
        rule = _conv_grad_input_gemm if gemm else _conv_grad_input
        results[0] = rule(low, val[0], grad_out, w, geo, groups)
    if output_mask[1]:
        rule = _conv_grad_weight_gemm if gemm else _conv_grad_weight
        results[1] = rule(low, val[1], grad_out, x, w, geo, groups)
    if output_mask[2]:
        results[2] = _conv_grad_bias(low, val[2], grad_out, nsp)
    return results


def _gemm(low, shape, acc: str, a: ir.GemmOperand, b: ir.GemmOperand, batch, m, n, k) -> TensorRef:
    """A GEMM node: out[batch, m, n] (stored as ``shape``) = a @ b, accumulated in ``acc``."""
    buf = low.new_buffer(acc, shape)
    gemm = ir.Gemm(a, b, sympy.sympify(batch), sympy.sympify(m), sympy.sympify(n), sympy.sympify(k), acc_dtype=acc)
    low.nodes.append(ir.Node(low.fresh("n"), "gemm", buf, gemm=gemm, source=low.source()))
    return identity_ref(buf)


def _operand(ref: TensorRef, batch_stride, row_stride, col_stride) -> ir.GemmOperand:
    return ir.GemmOperand(ref.buffer.name, sympy.Integer(0), sympy.sympify(batch_stride), sympy.sympify(row_stride),
                          sympy.sympify(col_stride))


def _conv_grad_input_gemm(low, val, grad_out, w, geo, groups):
    """Per batch element, patches' gradient dcols[(ci, k), o] = W^T [Cin*K, Cout] @ gout [Cout, O]; then col2im."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    nsp = len(w.shape) - 2
    lead = len(shape) - nsp - 1
    cout, cin, kernel, o_sizes = w.shape[0], w.shape[1], list(w.shape[2:]), list(grad_out.shape[lead + 1:])
    kp, op = ir.product(kernel), ir.product(o_sizes)
    batch = shape[0] if lead else sympy.Integer(1)
    dcols = _gemm(low, (batch, cin * kp, op), acc, _operand(w, 0, 1, cin * kp),
                  _operand(grad_out, cout * op if lead else 0, op, 1), batch, cin * kp, op, cout)
    h_vars = [ir.ivar(lead + 1 + d) for d in range(nsp)]
    k_vars = [ir.rvar(d) for d in range(nsp)]
    last = window_last(h_vars, shape[lead + 1:], k_vars, kernel)
    taps, conds = _taps(h_vars, k_vars, geo, o_sizes, last)
    k_flat, o_flat = _flat(k_vars, kernel), _flat(taps, o_sizes)
    v = dcols.load([ir.ivar(0) if lead else 0, ir.ivar(lead) * kp + k_flat, o_flat])
    total = reduction(low, shape, acc, "sum", kernel, masked(all_of(conds), v, acc))
    return _rounded(low, total, out)


def _conv_grad_weight_gemm(low, val, grad_out, x, w, geo, groups):
    """gw [Cout, Cin*K] = gout^T [Cout, N*O] @ im2col(x) [N*O, Cin*K] (patches zero where they read padding)."""
    stride, padding, dilation = geo
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    nsp = len(w.shape) - 2
    lead = len(x.shape) - nsp - 1
    cout, cin, kernel, o_sizes = w.shape[0], w.shape[1], list(w.shape[2:]), list(grad_out.shape[lead + 1:])
    kp, op = ir.product(kernel), ir.product(o_sizes)
    n = list(grad_out.shape[:lead])
    o_vars = [ir.ivar(lead + d) for d in range(nsp)]
    k_vars = [ir.ivar(lead + nsp + 1 + d) for d in range(nsp)]
    last = window_last(o_vars, o_sizes, k_vars, kernel)
    patch = window_load(x, [ir.ivar(0)] * lead + [ir.ivar(lead + nsp)],
                        window_positions(o_vars, k_vars, stride, padding, dilation), 0, acc, last)
    cols = low.pointwise(tuple(n + o_sizes + [cin] + kernel), acc, patch)
    if lead:  # gout as [Cout, N, O...]: the GEMM's rows must be one stride apart
        g_t = grad_out.load([ir.ivar(1), ir.ivar(0)] + [ir.ivar(2 + d) for d in range(nsp)])
        grad_out = low.pointwise(tuple([cout] + n + o_sizes), grad_out.dtype, g_t)
    rows = ir.product(n) * op
    prod = _gemm(low, (cout, cin * kp), acc, _operand(grad_out, 0, rows, 1), _operand(cols, 0, cin * kp, 1),
                 1, cout, cin * kp, rows)
    k_flat = _flat([ir.ivar(2 + d) for d in range(nsp)], kernel)
    gw = TensorRef(prod.buffer, tuple(shape), (ir.ivar(0), ir.ivar(1) * kp + k_flat))
    return _rounded(low, gw, out)


def _flat(vars_, sizes) -> sympy.Expr:
    """The row-major position of ``vars_`` in a block of ``sizes``."""
    pos = sympy.Integer(0)
    for v, size in zip(vars_, sizes):
        pos = pos * size + v
    return pos


def _conv_grad_input(low, val, grad_out, w, geo, groups):
    """gx[n, c, h...] = sum over (co of c's group, k...) of gout[n, co, (h + p - k*d) / s] * w[co, c % Cg, k...]."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    nsp = len(w.shape) - 2
    lead = len(shape) - nsp - 1
    cg, cog = w.shape[1], w.shape[0] // groups
    c = ir.ivar(lead)
    co = ir.rvar(0) if groups == 1 else FloorDiv(c, cg) * cog + ir.rvar(0)
    ci = c if groups == 1 else c - FloorDiv(c, cg) * cg
    h_vars = [ir.ivar(lead + 1 + d) for d in range(nsp)]
    k_vars = [ir.rvar(1 + d) for d in range(nsp)]
    last = window_last(h_vars, shape[lead + 1:], k_vars, w.shape[2:])
    taps, conds = _taps(h_vars, k_vars, geo, list(grad_out.shape[lead + 1:]), last)
    g = cast(grad_out.load([ir.ivar(0)] * lead + [co] + taps), acc)
    body = ir.Op(acc, "mul", (g, cast(w.load([co, ci] + k_vars), acc)))
    total = reduction(low, shape, acc, "sum", [cog] + list(w.shape[2:]), masked(all_of(conds), body, acc))
    return _rounded(low, total, out)


def _conv_grad_weight(low, val, grad_out, x, w, geo, groups):
    """gw[co, ci, k...] = sum over (n, o...) of gout[n, co, o...] * x[n, g*Cg + ci, o*s - p + k*d]."""
    stride, padding, dilation = geo
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    nsp = len(w.shape) - 2
    lead = len(x.shape) - nsp - 1
    cg, cog = w.shape[1], w.shape[0] // groups
    co, ci = ir.ivar(0), ir.ivar(1)
    cin = ci if groups == 1 else FloorDiv(co, cog) * cg + ci
    o_vars = [ir.rvar(lead + d) for d in range(nsp)]
    k_vars = [ir.ivar(2 + d) for d in range(nsp)]
    o_sizes = list(grad_out.shape[lead + 1:])
    last = window_last(o_vars, o_sizes, k_vars, w.shape[2:])
    batch = [ir.rvar(0)] * lead
    xv = window_load(x, batch + [cin], window_positions(o_vars, k_vars, stride, padding, dilation), 0, acc, last)
    g = cast(grad_out.load(batch + [co] + o_vars), acc)
    ranges = list(grad_out.shape[:lead]) + o_sizes
    total = reduction(low, shape, acc, "sum", ranges, ir.Op(acc, "mul", (g, xv)))
    return _rounded(low, total, out)


def _conv_grad_bias(low, val, grad_out, nsp: int):
    """gb[co] = sum over every other dim of gout."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
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
    total = reduction(low, shape, acc, "sum", [grad_out.shape[d] for d in rest], cast(grad_out.load(idx), acc))
    return _rounded(low, total, out)


@RULES.rule(aten.max_pool2d_with_indices_backward)
def _max_pool2d_backward(low, node, val, grad_out, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """gx[.., h, w] = sum over the window taps (kh, kw) of gout[.., oh, ow] where (oh, ow) is the window that
    tap belongs to and its recorded argmax (``indices``, a flat position in the plane) is (h, w). Windows that
    tile the plane (stride = kernel, no padding or dilation) hold each position once: no sum, one tap."""
    kernel = ints(kernel_size, 2)
    stride, padding, dilation = ints(stride, 2) or kernel, ints(padding, 2), ints(dilation, 2)
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    lead = len(shape) - 2
    h_vars = [ir.ivar(lead + d) for d in range(2)]
    tiled = stride == kernel and padding == [0, 0] and dilation == [1, 1]
    k_vars = [ir.rvar(d) for d in range(2)]
    last = window_last(h_vars, shape[lead:], k_vars, kernel)
    taps, conds = [], []
    for d in range(2):
        if tiled:
            o, cond = _window_of(h_vars[d], stride[d], shape[lead + d], grad_out.shape[lead + d])
        else:
            o, cond = _tap(h_vars[d] + padding[d] - k_vars[d] * dilation[d], stride[d], grad_out.shape[lead + d],
                           last)
        taps.append(o)
        conds += cond
    at = [ir.ivar(k) for k in range(lead)] + taps
    flat = index_value(h_vars[0] * shape[lead + 1] + h_vars[1])
    conds.append(ir.Op("bool", "eq", (ir.Op("int64", "cast", (indices.load(at),)) if indices.dtype != "int64"
                                      else indices.load(at), flat)))
    body = masked(all_of(conds), cast(grad_out.load(at), acc), acc)
    if tiled:
        return low.pointwise(shape, out, cast(body, out))
    total = reduction(low, shape, acc, "sum", kernel, body)
    return _rounded(low, total, out)


def _window_of(h, stride: int, size, windows) -> tuple:
    """The one window position h lies in when windows tile the dim (h // stride), and the condition that there is
    one: a position past the last whole window (floor mode) is in none."""
    if sympy.expand(size - windows * stride) == 0:
        return FloorDiv(h, stride), []
    inside = ir.Op("bool", "lt", (index_value(h), index_value(windows * stride)))
    return sympy.Min(FloorDiv(h, stride), windows - 1), [inside]
