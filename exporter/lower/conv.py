"""Lowering rules for convolution, pooling and batch norm in eval mode.

Convolution and pooling are reductions over a window: out[n, c, o...] accumulates over (cin of the group, k...)
the input at o*stride - padding + k*dilation. Positions that fall in the padding read a fill value (0 for a sum,
-inf for a max) through a bounds check on the index, and the load itself is clamped so it never leaves the buffer.
Bias, batch norm (a per-channel scale and shift computed once per call) and activations are pointwise nodes over
the output, which fusion runs in the convolution's own kernel, right after each output's reduction. A batch norm
whose input is a convolution's only use never gets here: capture folds it into the convolution's weight and bias
(``fold_batchnorm``); the rule below covers the rest (after a pooling, a sum, a user input...).
"""

from __future__ import annotations

import itertools
import math

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower import ops as lower_ops
from tcexport.exporter.lower.rules import RuleTable
from tcexport.exporter.lower.context import TensorRef, torch_dtype_name
from tcexport.exporter.lower.reduce import reduction
from tcexport.exporter.lower.values import all_of, cast, index_value, ivars, shape_of

aten = torch.ops.aten
RULES = RuleTable("tcexport.exporter.lower.conv")


def ints(v, n: int) -> list:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if not v:
        return []
    return v * n if len(v) == 1 else v


def window_load(x: TensorRef, lead: list, positions: list, fill, dtype: str, last: dict) -> ir.Value:
    """x[lead..., positions...] (cast to ``dtype``), or ``fill`` where a position is outside x's spatial dims.
    ``last`` gives each index variable's largest value; a bound is checked only where it can be crossed."""
    sizes = x.shape[len(lead):]
    conds, idx = [], list(lead)
    for pos, size in zip(positions, sizes):
        pos = sympy.sympify(pos)
        # (sympify: a bare variable replaced is the replacement itself, a Python int)
        lo = sympy.sympify(pos.xreplace({s: 0 for s in pos.free_symbols if _is_var(s)}))
        hi = sympy.sympify(pos.xreplace({s: last.get(s, sympy.oo) for s in pos.free_symbols if _is_var(s)}))
        clamped = pos
        if not lo.is_nonnegative:
            conds.append(ir.Op("bool", "ge", (index_value(pos), ir.Const("int64", 0))))
            clamped = sympy.Max(clamped, 0)
        if hi is None or not sympy.expand(size - 1 - hi).is_nonnegative:
            conds.append(ir.Op("bool", "lt", (index_value(pos), index_value(size))))
            clamped = sympy.Min(clamped, size - 1)
        idx.append(clamped)
    v = cast(x.load(idx), dtype)
    cond = all_of(conds)
    return v if cond is None else ir.Op(dtype, "where", (cond, v, ir.Const(dtype, fill)))


def window_reach(kernel: list, sizes, padding: list, dilation: list) -> list:
    """How much of a window a reduction must visit per dim: tap k reads input position o*s - p + k*d, which is
    past the input for every output once k*d >= size + p, so a window larger than the padded input (a global
    pool written as AvgPool2d(1280) over 7x7, as EfficientNet does) reduces over only what can be read."""
    out = []
    for k, size, p, d in zip(kernel, sizes, padding, dilation):
        size = sympy.sympify(size)
        out.append(min(k, -(-(int(size) + p) // d)) if size.is_Integer else k)
    return out


def _is_var(s) -> bool:
    return s.name[0] in "ir" and s.name[1:].isdigit()


def window_positions(out_vars, kernel_vars, stride, padding, dilation) -> list:
    return [o * s - p + k * d for o, k, s, p, d in zip(out_vars, kernel_vars, stride, padding, dilation)]


def window_last(out_vars, out_sizes, kernel_vars, kernel_sizes) -> dict:
    """Each output / window variable's largest value."""
    return {v: sympy.sympify(n) - 1 for v, n in list(zip(out_vars, out_sizes)) + list(zip(kernel_vars, kernel_sizes))}


@RULES.rule(aten.convolution)
def _convolution(low, node, val, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """out[n, co, o...] = bias[co] + sum over (ci, k...) of x[n, g*Cg + ci, o*s - p + k*d] * w[co, ci, k...],
    g = co // (Cout / groups)."""
    if transposed:
        raise NotImplementedError("transposed convolution")
    nsp = len(w.shape) - 2
    lead = len(x.shape) - nsp - 1  # 1 with a batch dim, 0 without
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    stride, padding, dilation = ints(stride, nsp), ints(padding, nsp), ints(dilation, nsp)
    if groups == 1 and ir.compute_dtype(out) in ("float32", "float64"):
        return _convolution_gemm(low, val, x, w, bias, (stride, padding, dilation), lead)
    if groups > 1 and w.shape[1] == 1 and _static_taps(w.shape[2:]) <= DEPTHWISE_MAX_TAPS:
        return _convolution_depthwise(low, val, x, w, bias, (stride, padding, dilation), lead, groups)
    co = ir.ivar(lead)
    cg = w.shape[1]
    ci = ir.rvar(0) if groups == 1 else FloorDiv(co, w.shape[0] // groups) * cg + ir.rvar(0)
    out_vars = [ir.ivar(lead + 1 + d) for d in range(nsp)]
    k_vars = [ir.rvar(1 + d) for d in range(nsp)]
    last = window_last(out_vars, shape[lead + 1:], k_vars, w.shape[2:])
    positions = window_positions(out_vars, k_vars, stride, padding, dilation)
    xv = window_load(x, [ir.ivar(0)] * lead + [ci], positions, 0, out, last)
    wv = cast(w.load([co, ir.rvar(0)] + k_vars), out)
    acc = reduction(low, shape, out, "sum", [cg] + list(w.shape[2:]), ir.Op(out, "mul", (xv, wv)))
    if bias is None:
        return acc
    body = ir.Op(out, "add", (acc.load(ivars(len(shape))), cast(bias.load([co]), out)))
    return low.pointwise(shape, out, body)


DEPTHWISE_MAX_TAPS = 64  # a 7x7 window (ConvNeXt) is 49


def _static_taps(kernel) -> float:
    """The number of taps of a window whose sizes are all known at export, else infinity."""
    sizes = [sympy.sympify(k) for k in kernel]
    return math.prod(int(k) for k in sizes) if all(k.is_Integer for k in sizes) else math.inf


def _convolution_depthwise(low, val, x, w, bias, geo, lead: int, groups: int):
    """A convolution in which each output channel reads one input channel (depthwise: MobileNet, EfficientNet,
    ConvNeXt) as one pointwise node: the window's taps written out as a sum of products. As a reduction it
    would reduce over a handful of taps per output, one output at a time (a 5x5 depthwise layer of
    MobileNetV3 took 9.8 ms at batch 8 on 2 cores); pointwise, the backends vectorise across the output row
    and every tap is a fixed offset."""
    stride, padding, dilation = geo
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    nsp = len(w.shape) - 2
    kernel = [int(sympy.sympify(k)) for k in w.shape[2:]]
    co = ir.ivar(lead)
    ci = FloorDiv(co, w.shape[0] // groups)  # w.shape[0] // groups outputs read each input channel
    out_vars = [ir.ivar(lead + 1 + d) for d in range(nsp)]
    last = window_last(out_vars, shape[lead + 1:], [], [])
    total = None
    for taps in itertools.product(*[range(k) for k in kernel]):
        positions = window_positions(out_vars, taps, stride, padding, dilation)
        xv = window_load(x, [ir.ivar(0)] * lead + [ci], positions, 0, out, last)
        term = ir.Op(out, "mul", (xv, cast(w.load([co, 0, *taps]), out)))
        total = term if total is None else ir.Op(out, "add", (total, term))
    if bias is not None:
        total = ir.Op(out, "add", (total, cast(bias.load([co]), out)))
    return low.pointwise(shape, out, total)


def _window_taps(x: TensorRef, lead: int, out_vars, out_sizes, kernel, geo, fill, dtype: str, op: str):
    """A pooling window's taps written out and folded with the pointwise ``op`` (as _convolution_depthwise writes
    its sum), or None when the window's size is not known at export or has more than DEPTHWISE_MAX_TAPS taps. As a
    reduction, each output reduced its few strided taps on its own, in scalar code: ResNet-50's 3x3 max pool took
    17 ms of a 430 ms call at batch 8; pointwise, the output row vectorises."""
    if _static_taps(kernel) > DEPTHWISE_MAX_TAPS:
        return None
    last = window_last(out_vars, out_sizes, [], [])
    total = None
    for taps in itertools.product(*[range(int(sympy.sympify(k))) for k in kernel]):
        v = window_load(x, [ir.ivar(k) for k in range(lead)], window_positions(out_vars, taps, *geo), fill, dtype,
                        last)
        total = v if total is None else ir.Op(dtype, op, (total, v))
    return total


def _split(e, sizes: list) -> list:
    """Row-major position ``e`` in a block of ``sizes`` as one index per dim (div/mod that flat_index folds back)."""
    out = []
    for d, size in enumerate(sizes):
        inner = ir.product(sizes[d + 1:])
        q = e if inner == 1 else FloorDiv(e, inner)
        out.append(q if d == 0 else ModularIndexing(e, inner, size))
    return out


def _convolution_gemm(low, val, x, w, bias, geo, lead: int):
    """im2col + GEMM: cols[n, (ci, k...), o...] is x at each output's window (0 in the padding), then
    out[n] = W [Cout, Cin*K] @ cols[n] [Cin*K, O] + bias, the bias (and the rounding of 16-bit outputs) in the
    GEMM's epilogue. The product runs on the backends' GEMMs (BLAS or the AVX-512 kernel on the CPU, the Triton
    template on the GPU) instead of a scalar reduction per output; cols costs K times the input's memory, so a
    1x1 convolution with stride 1 and no padding (a third of a ResNet's) reads x as its operand directly."""
    stride, padding, dilation = geo
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    nsp = len(w.shape) - 2
    cout, cin, kernel = w.shape[0], w.shape[1], list(w.shape[2:])
    o_sizes = list(shape[lead + 1:])
    kp, op = ir.product(kernel), ir.product(o_sizes)
    n = list(shape[:lead])
    k_vars = [ir.ivar(lead + 1 + d) for d in range(nsp)]
    o_vars = [ir.ivar(lead + 1 + nsp + d) for d in range(nsp)]
    last = window_last(o_vars, o_sizes, k_vars, kernel)
    row, col = ir.ivar(1), ir.ivar(2)  # the operands' (batch, row, col) = (i0, i1, i2)
    a = _view(w, tuple(n + [cout, cin * kp]), [row] + _split(col, [cin] + kernel), lead)
    batch = [ir.ivar(0)] if lead else []
    if kp == 1 and all(s == 1 for s in stride) and not any(padding) and x.buffer.dtype == out:
        # a 1x1 window over every position: x itself is the [Cin, O] operand, no copy
        b = _view(x, tuple(n + [cin, op]), batch + [row] + _split(col, o_sizes), lead)
    else:
        patch = window_load(x, [ir.ivar(0)] * lead + [ir.ivar(lead)],
                            window_positions(o_vars, k_vars, stride, padding, dilation), 0, out, last)
        cols = low.pointwise(tuple(n + [cin] + kernel + o_sizes), out, patch)
        b = _view(cols, tuple(n + [cin * kp, op]), batch + _split(row, [cin] + kernel) + _split(col, o_sizes), lead)
    prod = lower_ops.gemm(low, val, a, b, batched=bool(lead))
    acc = prod.dtype
    body = prod.load(ivars(len(shape)))
    if bias is not None:
        body = ir.Op(acc, "add", (body, cast(bias.load([ir.ivar(lead)]), acc)))
    return prod if bias is None and acc == out else low.pointwise(shape, out, cast(body, out))


def _view(ref: TensorRef, shape: tuple, index: list, lead: int) -> TensorRef:
    """``ref`` seen as a GEMM operand of ``shape``; ``index`` is over the operand's (batch, row, col) variables
    (i0, i1, i2), shifted down to (i0, i1) for an unbatched GEMM as TensorRef views are."""
    if not lead:
        index = [sympy.sympify(e).xreplace({ir.ivar(1): ir.ivar(0), ir.ivar(2): ir.ivar(1)}) for e in index]
    mapping = {ir.ivar(k): e for k, e in enumerate(index)}
    return TensorRef(ref.buffer, shape, tuple(sympy.sympify(e).xreplace(mapping) for e in ref.index))


@RULES.rule(aten.max_pool2d_with_indices)
def _max_pool2d(low, node, val, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Values: a max over the window (padding reads -inf). Indices: an argmax over the same window, turned into
    the flat position in the input plane, as PyTorch returns it; dropped when unused."""
    kernel = ints(kernel_size, 2)
    stride, padding, dilation = ints(stride, 2) or kernel, ints(padding, 2), ints(dilation, 2)
    shape, out = shape_of(low, val[0]), torch_dtype_name(val[0].dtype)
    lead = len(x.shape) - 2
    kernel = window_reach(kernel, x.shape[lead:], padding, dilation)  # also what the argmax is decoded with
    out_vars = [ir.ivar(lead + d) for d in range(2)]
    k_vars = [ir.rvar(d) for d in range(2)]
    last = window_last(out_vars, shape[lead:], k_vars, kernel)
    positions = window_positions(out_vars, k_vars, stride, padding, dilation)
    v = window_load(x, [ir.ivar(k) for k in range(lead)], positions, -math.inf, out, last)
    unrolled = _window_taps(x, lead, out_vars, shape[lead:], kernel, (stride, padding, dilation), -math.inf, out,
                            "maximum")
    values = low.pointwise(shape, out, unrolled) if unrolled is not None else reduction(low, shape, out, "max",
                                                                                         kernel, v)
    arg = reduction(low, shape, "int64", "argmax", kernel, v).load(ivars(len(shape)))
    kh = ir.Op("int64", "floordiv", (arg, ir.Const("int64", kernel[1])))
    kw = ir.Op("int64", "remainder", (arg, ir.Const("int64", kernel[1])))

    def plane_pos(d, k):
        start = index_value(out_vars[d] * stride[d] - padding[d])
        return ir.Op("int64", "add", (start, ir.Op("int64", "mul", (k, ir.Const("int64", dilation[d])))))

    row = ir.Op("int64", "mul", (plane_pos(0, kh), index_value(x.shape[-1])))
    flat = ir.Op("int64", "add", (row, plane_pos(1, kw)))
    return [values, low.pointwise(shape, "int64", flat)]


@RULES.rule(aten.avg_pool2d)
def _avg_pool2d(low, node, val, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    """A sum over the window (padding reads 0) divided by the window's size: counting the padding or not,
    and never counting what lies past the padding (ceil_mode), as PyTorch does."""
    kernel = ints(kernel_size, 2)
    stride, padding = ints(stride, 2) or kernel, ints(padding, 2)
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    lead = len(x.shape) - 2
    out_vars = [ir.ivar(lead + d) for d in range(2)]
    k_vars = [ir.rvar(d) for d in range(2)]
    reach = window_reach(kernel, x.shape[lead:], padding, [1, 1])  # the divisor below counts the whole window
    last = window_last(out_vars, shape[lead:], k_vars, reach)
    positions = window_positions(out_vars, k_vars, stride, padding, [1, 1])
    v = window_load(x, [ir.ivar(k) for k in range(lead)], positions, 0, out, last)
    total = _window_taps(x, lead, out_vars, shape[lead:], reach, (stride, padding, [1, 1]), 0, out, "add")
    if total is None:
        total = reduction(low, shape, out, "sum", reach, v).load(ivars(len(shape)))
    if divisor_override:
        count = ir.Const(out, float(divisor_override))
    else:
        n = sympy.Integer(1)
        for d in range(2):
            start = out_vars[d] * stride[d] - padding[d]
            size = x.shape[lead + d]
            end = sympy.Min(start + kernel[d], size + padding[d])
            if not count_include_pad:
                start, end = sympy.Max(start, 0), sympy.Min(end, size)
            n = n * (end - start)
        count = cast(index_value(n), out)
    return low.pointwise(shape, out, ir.Op(out, "div", (total, count)))


@RULES.rule(aten._adaptive_avg_pool2d, aten.adaptive_avg_pool2d)
def _adaptive_avg_pool2d(low, node, val, x, output_size):
    """Output o of a dim of size I averages [floor(o*I/O), ceil((o+1)*I/O)): a reduction over the widest
    window, masked to each output's own."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    lead = len(x.shape) - 2
    idx, conds, widths, count = [ir.ivar(k) for k in range(lead)], [], [], sympy.Integer(1)
    for d in range(2):
        size, n_out, o, r = x.shape[lead + d], shape[lead + d], ir.ivar(lead + d), ir.rvar(d)
        if not (size.is_Integer and n_out.is_Integer):
            raise NotImplementedError("adaptive pooling over a dynamic spatial size")
        size, n_out = int(size), int(n_out)
        if size % n_out == 0:
            k = size // n_out
            idx.append(o * k + r)
            widths.append(k)
            count = count * k
            continue
        start, end = FloorDiv(o * size, n_out), FloorDiv((o + 1) * size + n_out - 1, n_out)
        widths.append(max(-(-(j + 1) * size // n_out) - (j * size // n_out) for j in range(n_out)))
        idx.append(sympy.Min(start + r, size - 1))
        conds.append(ir.Op("bool", "lt", (index_value(r), index_value(end - start))))
        count = count * (end - start)
    v = cast(x.load(idx), out)
    cond = all_of(conds)
    body = v if cond is None else ir.Op(out, "where", (cond, v, ir.Const(out, 0)))
    total = reduction(low, shape, out, "sum", widths, body).load(ivars(len(shape)))
    return low.pointwise(shape, out, ir.Op(out, "div", (total, cast(index_value(count), out))))


@RULES.rule(aten._native_batch_norm_legit_no_training)
def _batch_norm_eval(low, node, val, x, weight, bias, mean, var, momentum, eps):
    """Eval-mode batch norm as y = x * scale[c] + shift[c]: scale and shift are computed once per call from the
    running statistics (C elements), and the per-element part is two ops that fusion moves into the producer's
    kernel (a convolution's epilogue). For 16-bit floats scale, shift and x * scale + shift stay in float32 and
    round once at the output, as PyTorch's CPU kernel does (rounding scale/shift too is a few ulp off eager)."""
    shape, out = shape_of(low, val[0]), torch_dtype_name(val[0].dtype)
    acc = ir.compute_dtype(out)
    c = (mean.shape[0],)
    i = (ir.ivar(0),)
    scale = ir.Op(acc, "rsqrt", (ir.Op(acc, "add", (cast(var.load(i), acc), ir.Const(acc, float(eps)))),))
    if weight is not None:
        scale = ir.Op(acc, "mul", (scale, cast(weight.load(i), acc)))
    scale = low.pointwise(c, acc, scale)
    shift = ir.Op(acc, "neg", (ir.Op(acc, "mul", (cast(mean.load(i), acc), scale.load(i))),))
    if bias is not None:
        shift = ir.Op(acc, "add", (shift, cast(bias.load(i), acc)))
    shift = low.pointwise(c, acc, shift)
    ch = [ir.ivar(1)] if len(shape) > 1 else [ir.ivar(0)]
    y = ir.Op(acc, "add", (ir.Op(acc, "mul", (cast(x.load(ivars(len(shape))), acc), scale.load(ch))),
                           shift.load(ch)))
    return [low.pointwise(shape, out, cast(y, out)), None, None]
