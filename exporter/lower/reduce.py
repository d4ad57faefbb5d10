"""Lowering rules for reductions and scans: sum, prod, amax/amin, any/all, mean, var, argmax/argmin, cumsum.

A reduction node accumulates ``body`` over its reduce ranges (r0, r1, ...). ``argmax`` / ``argmin`` accumulate
the body's value and report the row-major flat position (over the reduce ranges) of its first extreme (NaN counts
as the extreme, as in PyTorch); their output is int64. A reduction whose reduce ranges are all 1 (or that has
none, e.g. over a 0-d tensor) is a pointwise node: there is nothing to accumulate.
"""

from __future__ import annotations

import sympy
import torch

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower.rules import RuleTable
from tcexport.exporter.lower.context import Lowering, TensorRef, torch_dtype_name
from tcexport.exporter.lower.values import cast, ivars, norm_dims, shape_of, value_at

aten = torch.ops.aten
prims = torch.ops.prims
RULES = RuleTable("tcexport.exporter.lower.reduce")


def reduction(low: Lowering, shape, dtype: str, op: str, reduce_ranges, body: ir.Value) -> TensorRef:
    """A reduction node, or the pointwise node it degenerates to when it reduces over nothing."""
    reduce_ranges = tuple(sympy.sympify(r) for r in reduce_ranges)
    if all(r == 1 for r in reduce_ranges):
        zero = {ir.rvar(k): sympy.Integer(0) for k in range(len(reduce_ranges))}
        single = ir.Const("int64", 0) if op in ("argmax", "argmin") else cast(ir.subs_index(body, zero), dtype)
        return low.pointwise(shape, dtype, single)
    return low.reduction(shape, dtype, op, reduce_ranges, body)


def _reduce(low, val, op: str, x: TensorRef, dims, keepdim: bool, compute: str | None = None, body_fn=None,
            cast_back: bool = True):
    """``op`` over ``dims`` of x (all dims when None or empty), accumulated in ``compute`` and cast to val's
    dtype unless ``cast_back`` is False (the caller finishes in ``compute``, e.g. mean's division). Returns the
    result and the number of elements each output reduces over."""
    rank = len(x.shape)
    dims = sorted(set(norm_dims(list(range(rank)) if dims is None or dims == [] else dims, rank)))
    out = torch_dtype_name(val.dtype)
    compute = compute or out
    out_shape = shape_of(low, val)
    idx, k, r = [], 0, 0
    for d in range(rank):
        if d in dims:
            idx.append(ir.rvar(r))
            r += 1
            if keepdim:
                k += 1
        else:
            idx.append(ir.ivar(k))
            k += 1
    body = x.load(idx)
    body = body if op in ("argmax", "argmin") else cast(body, compute)
    if body_fn is not None:
        body = body_fn(body, idx)
    ref = reduction(low, out_shape, compute, op, [x.shape[d] for d in dims], body)
    if compute != out and cast_back:
        ref = low.pointwise(out_shape, out, cast(ref.load(ivars(len(out_shape))), out))
    return ref, ir.product(x.shape[d] for d in dims)


@RULES.rule(aten.sum, prims.sum)
def _sum(low, node, val, x, dims=None, keepdim=False, dtype=None, output_dtype=None):
    if node.target is prims.sum.default:
        keepdim = False
    return _reduce(low, val, "sum", x, dims, keepdim)[0]


@RULES.rule(aten.amax, prims.amax)
def _amax(low, node, val, x, dims=None, keepdim=False):
    return _reduce(low, val, "max", x, dims, keepdim)[0]


@RULES.rule(aten.amin, prims.amin)
def _amin(low, node, val, x, dims=None, keepdim=False):
    return _reduce(low, val, "min", x, dims, keepdim)[0]


@RULES.rule(aten.argmax)
def _argmax(low, node, val, x, dim=None, keepdim=False):
    return _reduce(low, val, "argmax", x, None if dim is None else [dim], keepdim, compute="int64")[0]


@RULES.rule(aten.argmin)
def _argmin(low, node, val, x, dim=None, keepdim=False):
    return _reduce(low, val, "argmin", x, None if dim is None else [dim], keepdim, compute="int64")[0]


@RULES.rule(aten.any)
def _any(low, node, val, x, dims=None, keepdim=False):
    return _reduce(low, val, "max", x, dims, keepdim, compute="bool")[0]  # the load is cast to bool: nonzero


@RULES.rule(aten.all)
def _all(low, node, val, x, dims=None, keepdim=False):
    return _reduce(low, val, "min", x, dims, keepdim, compute="bool")[0]


@RULES.rule(aten.cumsum)
def _cumsum(low, node, val, x, dim, dtype=None):
    """out[..., i, ...] = sum over r <= i of x[..., r, ...], as a masked reduction over the whole dim.
    Quadratic in that dim's size: fine for masks and position ids, not for long scans."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    rank = len(shape)
    dim %= max(rank, 1)
    if rank == 0:
        return low.pointwise((), out, cast(x.load(()), out))
    idx = [ir.rvar(0) if d == dim else ir.ivar(d) for d in range(rank)]
    keep = ir.Op("bool", "le", (ir.IndexValue("int64", ir.rvar(0)), ir.IndexValue("int64", ir.ivar(dim))))
    body = ir.Op(out, "where", (keep, cast(x.load(idx), out), ir.Const(out, 0)))
    return reduction(low, shape, out, "sum", [shape[dim]], body)


@RULES.rule(aten.prod, prims.prod)
def _prod(low, node, val, x, dims=None, keepdim=False, dtype=None):
    if isinstance(dims, int):
        dims = [dims]
    return _reduce(low, val, "prod", x, dims, keepdim)[0]


@RULES.rule(aten.mean)
def _mean(low, node, val, x, dims=None, keepdim=False, dtype=None):
    """sum / n, both in float32 for 16-bit floats and rounded once (PyTorch's CPU mean does the same)."""
    out = torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    total, n = _reduce(low, val, "sum", x, dims, keepdim, compute=acc, cast_back=False)
    shape = shape_of(low, val)
    mean = ir.Op(acc, "div", (total.load(ivars(len(shape))), value_at(n, shape, acc)))
    return low.pointwise(shape, out, cast(mean, out))


@RULES.rule(prims.var)
def _var(low, node, val, x, dims, correction=0, output_dtype=None):
    """Two-pass variance: mean first, then the mean squared deviation (both fuse into one row kernel). 16-bit
    floats keep every intermediate in float32 and round the result once."""
    out = torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    rank = len(x.shape)
    nd = norm_dims(list(range(rank)) if dims is None else dims, rank)
    keep_shape = tuple(sympy.Integer(1) if d in nd else x.shape[d] for d in range(rank))
    total, n = _reduce(low, _FakeVal(keep_shape, val.dtype), "sum", x, nd, True, compute=acc, cast_back=False)
    mean = low.pointwise(keep_shape, acc, ir.Op(acc, "div", (total.load(ivars(rank)), value_at(n, keep_shape, acc))))

    def sq_dev(v, idx):
        m = mean.load([sympy.Integer(0) if d in nd else e for d, e in enumerate(idx)])
        dev = ir.Op(acc, "sub", (v, m))
        return ir.Op(acc, "mul", (dev, dev))

    ss, _ = _reduce(low, val, "sum", x, nd, False, compute=acc, body_fn=sq_dev, cast_back=False)
    shape = shape_of(low, val)
    denom = value_at(sympy.Max(n - correction, 0), shape, acc)  # no elements left: 0 / 0, NaN as in PyTorch
    return low.pointwise(shape, out, cast(ir.Op(acc, "div", (ss.load(ivars(len(shape))), denom)), out))


class _FakeVal:
    """The two fields of a FakeTensor a rule reads, for an intermediate result no FX node describes."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype
