"""Lowering rules for the common ops: elementwise (unary, binary, compare, where, clamp, casts), views (reshape,
permute, expand, squeeze, slice, select: index arithmetic, no node), GEMM (mm, bmm, addmm; ``gemm`` and
``gemm_operand`` are shared with conv.py and schedule/fuse.py), and a few creators (full, scalar_tensor, split).
Each is a small function in this module's ``RULES`` table; core.py composes the tables per pipeline."""

from __future__ import annotations

import math

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower.rules import RuleTable
from tcexport.exporter.lower.context import Lowering, TensorRef, identity_ref, torch_dtype_name
from tcexport.exporter.lower.values import cast, is_float, ivars, norm_dims, promote, shape_of, value_at, view_of

aten = torch.ops.aten
prims = torch.ops.prims
RULES = RuleTable("tcexport.exporter.lower.ops")


def _pointwise(low: Lowering, val, op: str, *xs, compute: str | None = None):
    shape = shape_of(low, val)
    out = torch_dtype_name(val.dtype)
    compute = compute or out
    body = ir.Op(compute, op, tuple(value_at(x, shape, compute) for x in xs))
    return low.pointwise(shape, out, cast(body, out))


# --- elementwise ----------------------------------------------------------------------------------------------

UNARY = {
    "abs": [aten.abs], "neg": [aten.neg, prims.neg], "exp": [aten.exp, prims.exp], "log": [aten.log, prims.log],
    "sqrt": [aten.sqrt, prims.sqrt], "rsqrt": [aten.rsqrt, prims.rsqrt], "erf": [aten.erf, prims.erf],
    "tanh": [aten.tanh, prims.tanh], "sin": [aten.sin, prims.sin], "cos": [aten.cos, prims.cos],
    "sigmoid": [aten.sigmoid], "reciprocal": [aten.reciprocal, prims.reciprocal], "floor": [aten.floor],
    "ceil": [aten.ceil], "log1p": [aten.log1p], "expm1": [aten.expm1], "exp2": [aten.exp2],
    "relu": [aten.relu], "logical_not": [aten.logical_not], "sign": [aten.sign], "isnan": [aten.isnan],
    "trunc": [aten.trunc], "round": [aten.round], "log2": [aten.log2], "tan": [aten.tan], "atan": [aten.atan],
}
FLOAT_ONLY = {"exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sin", "cos", "sigmoid", "reciprocal", "log1p",
              "expm1", "exp2", "log2", "tan", "atan"}


def _unary_rule(name):
    def rule(low, node, val, x, **kw):
        out = torch_dtype_name(val.dtype)
        compute = out if name not in ("logical_not", "isnan") else x.dtype
        if name in ("logical_not",):
            compute = "bool"
        return _pointwise(low, val, name, x, compute=compute)
    return rule


for _name, _ops in UNARY.items():
    RULES.rule(*_ops)(_unary_rule(_name))


@RULES.rule(aten.bitwise_not)
def _bitwise_not(low, node, val, x):
    """``~x``: logical not on bool (``~mask``), two's-complement not on integers."""
    if torch_dtype_name(val.dtype) == "bool":
        return _pointwise(low, val, "logical_not", x, compute="bool")
    return _pointwise(low, val, "bitnot", x)

BINARY = {
    "add": [aten.add, prims.add], "sub": [aten.sub, prims.sub], "mul": [aten.mul, prims.mul],
    "maximum": [aten.maximum, prims.maximum], "minimum": [aten.minimum, prims.minimum],
    "pow": [aten.pow, prims.pow], "fmod": [aten.fmod, prims.fmod], "remainder": [aten.remainder],
    "atan2": [aten.atan2], "logical_and": [aten.logical_and, aten.bitwise_and],
    "logical_or": [aten.logical_or, aten.bitwise_or], "logical_xor": [aten.logical_xor, aten.bitwise_xor],
}
COMPARE = {"eq": [aten.eq, prims.eq], "ne": [aten.ne, prims.ne], "lt": [aten.lt, prims.lt],
           "le": [aten.le, prims.le], "gt": [aten.gt, prims.gt], "ge": [aten.ge, prims.ge]}


# binary ops whose CPU kernels use a Python scalar operand in the tensor's dtype (so rounded to a 16-bit float);
# the others (mul, div, clamp, ...) use it unrounded in float32
SCALAR_IN_DTYPE = {"add", "sub", "pow", "fmod", "remainder"}


def _binary_rule(name):
    def rule(low, node, val, a, b, alpha=1, **kw):
        if name in SCALAR_IN_DTYPE:
            a, b = (_as_dtype_scalar(x, torch_dtype_name(val.dtype)) for x in (a, b))
        if alpha != 1:
            return _scaled_binary(low, val, name, a, b, alpha)
        if name == "pow" and isinstance(a, TensorRef) and not isinstance(b, (bool, TensorRef)) \
                and b in POW_BY_MULTIPLY and torch_dtype_name(val.dtype) != "bool":
            return _power(low, val, a, int(b))
        if name.startswith("logical_") and torch_dtype_name(val.dtype) != "bool":
            return _pointwise(low, val, "bit" + name[len("logical_"):], a, b)  # bitwise ops on integers
        return _pointwise(low, val, name, a, b, compute="bool" if name.startswith("logical_") else None)
    return rule


POW_BY_MULTIPLY = (1, 2, 3, 4)


def _power(low, val, x, n: int):
    """x ** n for a small integer n as repeated products: what pow computes, at a fraction of the cost, and
    vectorisable (tanh-GELU's x ** 3, RMSNorm's x ** 2); for integers exactly eager's (wrapping) products, where
    a float pow loses bits (and Triton has no integer pow)."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    v = value_at(x, shape, out)
    acc = v
    for _ in range(n - 1):
        acc = ir.Op(out, "mul", (acc, v))
    return low.pointwise(shape, out, acc)


def _scaled_binary(low, val, name, a, b, alpha):
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    bv = ir.Op(out, "mul", (value_at(b, shape, out), value_at(alpha, shape, out)))
    return low.pointwise(shape, out, ir.Op(out, name, (value_at(a, shape, out), bv)))


for _name, _ops in BINARY.items():
    RULES.rule(*_ops)(_binary_rule(_name))


def _compare_rule(name):
    def rule(low, node, val, a, b):
        compute = promote(a, b)
        return _pointwise(low, val, name, *(_as_dtype_scalar(x, compute) for x in (a, b)), compute=compute)
    return rule


def _as_dtype_scalar(x, dtype: str):
    """A Python float operand of a 16-bit float op, rounded to that dtype, as PyTorch's comparisons and
    SCALAR_IN_DTYPE ops take it (they read the scalar converted to the common dtype)."""
    if dtype not in ir.HALF_DTYPES or not isinstance(x, float):
        return x
    return float(torch.tensor(x, dtype=getattr(torch, dtype)).item())


for _name, _ops in COMPARE.items():
    RULES.rule(*_ops)(_compare_rule(_name))


@RULES.rule(aten.div, prims.div)
def _div(low, node, val, a, b, rounding_mode=None):
    out = torch_dtype_name(val.dtype)
    if rounding_mode is None and is_float(out):
        return _pointwise(low, val, "div", a, b)
    if node.target is prims.div.default and not is_float(out):
        return _pointwise(low, val, "truncdiv", a, b)
    op = {"floor": "floordiv", "trunc": "truncdiv", None: "div"}[rounding_mode]
    return _pointwise(low, val, op, a, b)


@RULES.rule(aten.where, prims.where)
def _where(low, node, val, cond, a, b):
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    return low.pointwise(shape, out, ir.Op(out, "where", (value_at(cond, shape, "bool"), value_at(a, shape, out),
                                                          value_at(b, shape, out))))


@RULES.rule(aten.clamp, aten.clamp_min, aten.clamp_max)
def _clamp(low, node, val, x, lo=None, hi=None):
    if node.target is aten.clamp_max.default:
        lo, hi = None, lo
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    v = value_at(x, shape, out)
    if lo is not None:
        v = ir.Op(out, "maximum", (v, value_at(lo, shape, out)))
    if hi is not None:
        v = ir.Op(out, "minimum", (v, value_at(hi, shape, out)))
    return low.pointwise(shape, out, v)


@RULES.rule(prims.convert_element_type, aten._to_copy, aten.clone, aten.alias, aten.lift_fresh_copy,
          aten.detach, aten.contiguous)
def _copy(low, node, val, x, dtype=None, **kw):
    if isinstance(kw.get("device"), torch.device) and kw["device"].type != "cpu":
        raise NotImplementedError("device transfer")
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    if out == x.dtype and node.target in (aten.alias.default, aten.detach.default):
        return x
    return low.pointwise(shape, out, cast(x.load(ivars(len(shape))), out))


# --- views: index arithmetic, no nodes ------------------------------------------------------------------------


def _contiguous_strides(shape):
    out, acc = [], sympy.Integer(1)
    for s in reversed(shape):
        out.append(acc)
        acc = acc * s
    return list(reversed(out))


@RULES.rule(aten.view, aten._unsafe_view, aten.reshape, prims.reshape)
def _reshape(low, node, val, x, size=None, *rest):
    shape = shape_of(low, val)
    if tuple(shape) == tuple(x.shape):
        return x
    groups = _reshape_groups(tuple(x.shape), shape)
    if groups is None:  # sizes that cannot be matched up symbolically: one group over everything
        groups = [(list(range(len(x.shape))), list(range(len(shape))))]
    old_index = [sympy.Integer(0)] * len(x.shape)
    for old_dims, new_dims in groups:
        new_sizes = [shape[d] for d in new_dims]
        flat = sum((ir.ivar(d) * s for d, s in zip(new_dims, _contiguous_strides(new_sizes))), sympy.Integer(0))
        old_sizes = [x.shape[d] for d in old_dims]
        for k, (d, stride) in enumerate(zip(old_dims, _contiguous_strides(old_sizes))):
            if x.shape[d] == 1:
                continue
            old_index[d] = FloorDiv(flat, stride) if k == 0 else ModularIndexing(flat, stride, x.shape[d])
    return view_of(x, shape, old_index)


def _divides(a, b) -> bool:
    """Whether b / a is a whole (polynomial) factor, symbolically."""
    num, den = sympy.fraction(sympy.cancel(sympy.sympify(b) / a))
    return den == 1


def _reshape_groups(old: tuple, new: tuple):
    """Pair runs of old dims with runs of new dims of equal total size (as torch's view does), so each new
    position maps to old positions with division only inside its own run. None when sizes do not line up."""
    old_live = [d for d, s in enumerate(old) if s != 1]
    new_live = [d for d, s in enumerate(new) if s != 1]
    groups, a, b = [], 0, 0
    while a < len(old_live) and b < len(new_live):
        og, ng = [old_live[a]], [new_live[b]]
        po, pn = old[old_live[a]], new[new_live[b]]
        a, b = a + 1, b + 1
        while not ir.same_size(po, pn):
            if _divides(po, pn) and a < len(old_live):
                og.append(old_live[a])
                po, a = po * old[old_live[a]], a + 1
            elif _divides(pn, po) and b < len(new_live):
                ng.append(new_live[b])
                pn, b = pn * new[new_live[b]], b + 1
            else:
                return None
        groups.append((og, ng))
    return groups if a == len(old_live) and b == len(new_live) else None


@RULES.rule(aten.permute, prims.transpose)
def _permute(low, node, val, x, dims):
    dims = [d % len(x.shape) for d in dims]
    inv = [dims.index(k) for k in range(len(dims))]
    return view_of(x, [x.shape[d] for d in dims], [ir.ivar(inv[k]) for k in range(len(dims))])


@RULES.rule(aten.t, aten.transpose)
def _transpose(low, node, val, x, d0=0, d1=1):
    rank = len(x.shape)
    if rank < 2:
        return x
    perm = list(range(rank))
    perm[d0 % rank], perm[d1 % rank] = perm[d1 % rank], perm[d0 % rank]
    return _permute(low, node, val, x, perm)


@RULES.rule(aten.expand)
def _expand(low, node, val, x, size, **kw):
    shape = shape_of(low, val)
    off = len(shape) - len(x.shape)
    return view_of(x, shape, [sympy.Integer(0) if (s == 1 and shape[d + off] != 1) else ir.ivar(d + off)
                               for d, s in enumerate(x.shape)])


@RULES.rule(prims.broadcast_in_dim)
def _broadcast_in_dim(low, node, val, x, shape, broadcast_dims):
    shape = shape_of(low, val)
    return view_of(x, shape, [sympy.Integer(0) if (x.shape[k] == 1 and shape[d] != 1) else ir.ivar(d)
                               for k, d in enumerate(broadcast_dims)])


@RULES.rule(aten.unsqueeze)
def _unsqueeze(low, node, val, x, dim):
    rank = len(x.shape) + 1
    dim %= rank
    return view_of(x, shape_of(low, val), [ir.ivar(k if k < dim else k + 1) for k in range(rank - 1)])


@RULES.rule(aten.squeeze, prims.squeeze)
def _squeeze(low, node, val, x, dims=None):
    shape = shape_of(low, val)
    squeezable = range(len(x.shape)) if dims is None else norm_dims(dims, len(x.shape))
    kept = [d for d in range(len(x.shape)) if not (x.shape[d] == 1 and d in squeezable)]
    if len(kept) != len(shape):
        kept = [d for d in range(len(x.shape)) if x.shape[d] != 1]
    pos = {d: k for k, d in enumerate(kept)}
    return view_of(x, shape, [ir.ivar(pos[d]) if d in pos else sympy.Integer(0) for d in range(len(x.shape))])


@RULES.rule(aten.slice)
def _slice(low, node, val, x, dim=0, start=None, end=None, step=1):
    """x[start:end:step] along ``dim``. The result's length (export's, which already clamps ``end`` to the
    size, symbolic or not) comes from ``val``; the start is wrapped when negative and clamped to [0, size]."""
    shape = shape_of(low, val)
    dim %= len(x.shape)
    size = x.shape[dim]
    start = sympy.sympify(0 if start is None else start)
    if start.is_negative:
        start = sympy.Max(start + size, 0)
    elif not start.is_nonnegative:  # sign unknown (a symbolic expression): clamp as torch does at run time
        start = sympy.Max(0, start)
    if not sympy.expand(size - start).is_nonnegative:
        start = sympy.Min(start, size)
    return view_of(x, shape, [ir.ivar(k) * step + start if k == dim else ir.ivar(k) for k in range(len(shape))])


@RULES.rule(aten.select)
def _select(low, node, val, x, dim, index):
    dim %= len(x.shape)
    if isinstance(index, int) and index < 0:
        index = x.shape[dim] + index
    idx = [ir.ivar(k if k < dim else k - 1) for k in range(len(x.shape))]
    idx[dim] = sympy.sympify(index)
    return view_of(x, shape_of(low, val), idx)


# --- matrix products ------------------------------------------------------------------------------------------


def _gemm_operand(low: Lowering, x: TensorRef, batched: bool) -> ir.GemmOperand:
    index = tuple(x.index) if batched else _shift_ivars(tuple(x.index), +1)
    return gemm_operand(x.buffer, index, tuple(x.shape), batched)


def _shift_ivars(index: tuple, by: int) -> tuple:
    """Renumber index variables: an unbatched view's (i0, i1) are the operand's (row, col) = (i1, i2)."""
    moved = {ir.ivar(k): ir.ivar(k + by) for k in range(3) if k + by >= 0}
    return tuple(sympy.sympify(e).xreplace(moved) for e in index)


def gemm_operand(buffer: ir.Buffer, index: tuple, shape: tuple, batched: bool) -> ir.GemmOperand:
    """A view of ``buffer`` as a GEMM operand (``index`` over (i0, i1, i2) = (batch, row, col), i0 unused when
    unbatched; ``shape`` is the view's): strided when a BLAS call can take it, else the view's index itself
    (see ir.GemmOperand). No copy kernel is made; each backend reads the view as it can."""
    own = index if batched else _shift_ivars(index, -1)
    op = _strided(TensorRef(buffer, shape, own), batched)
    if op is None:
        zero = sympy.Integer(0)
        op = ir.GemmOperand(buffer.name, zero, zero, zero, zero, index=tuple(index))
    return op


def _strided(x: TensorRef, batched: bool) -> ir.GemmOperand | None:
    flat = x.buffer.flat_index(x.index)
    rank = len(x.shape)
    vars_ = [ir.ivar(k) for k in range(rank)]
    if flat.atoms(FloorDiv, ModularIndexing, sympy.Max, sympy.Min, sympy.floor, sympy.Mod):
        return None
    coeffs = [sympy.expand(flat.diff(v)) for v in vars_]
    if any(c.free_symbols & set(vars_) for c in coeffs):
        return None
    offset = sympy.expand(flat.xreplace({v: 0 for v in vars_}))
    bs, rs, cs = (coeffs if batched else [sympy.Integer(0)] + coeffs)
    rows, cols = x.shape[-2], x.shape[-1]
    if cols == 1 and cs != 1:
        cs = sympy.Integer(1)
    if rows == 1 and rs != 1:
        rs = sympy.Integer(1) if cs != 1 else cols
    return ir.GemmOperand(x.buffer.name, offset, bs, rs, cs) if _blas_layout(rs, cs, rows, cols) else None


def _blas_layout(rs, cs, rows, cols) -> bool:
    """Whether a rows x cols view with these strides is one a BLAS call takes: row-major with rows at least
    ``cols`` apart, or column-major with columns at least ``rows`` apart."""
    if cs == 1 and rows != 1 and not ir.same_size(rs, cols) and not (sympy.expand(rs - cols).is_nonnegative):
        return False
    if cs != 1 and rs != 1:
        return False
    return not (rs == 1 and cs != 1 and not (ir.same_size(cs, rows) or sympy.expand(cs - rows).is_nonnegative))


def _one_column_fold(ga: ir.GemmOperand, gb: ir.GemmOperand, batch, m, k):
    """(a, b) of the single GEMM out[batch, m] = b_rows [batch, k] @ a^T [k, m] that a batched GEMM with one
    column and a shared left operand computes (out[i, :, 0] = a @ b[i]), or None. A squeeze-excite block's 1x1
    convolutions over the pooled map are such products: run as ``batch`` GEMMs of one column each, a tile's
    lanes held one useful column in 32 (MobileNetV3-small at batch 8: 5.5 GFLOP/s, 9% of its call); as one
    GEMM the weight is read once for all rows, and at batch 1 it is a matrix-vector product."""
    if ga.index is not None or gb.index is not None or ga.rows is not None or gb.rows is not None or \
            sympy.sympify(ga.batch_stride) != 0:
        return None
    # one row (a static batch of 1): its stride is k, as _strided makes a single row's
    rows = ir.GemmOperand(gb.buffer, gb.offset, sympy.Integer(0),
                          k if sympy.sympify(batch) == 1 else gb.batch_stride, gb.row_stride)
    weight = ir.GemmOperand(ga.buffer, ga.offset, sympy.Integer(0), ga.col_stride, ga.row_stride)
    if not (_blas_layout(rows.row_stride, rows.col_stride, batch, k) and
            _blas_layout(weight.row_stride, weight.col_stride, k, m)):
        return None
    return rows, weight


def _mm(low: Lowering, val, a: TensorRef, b: TensorRef, batched: bool) -> TensorRef:
    """a @ b in val's dtype: a GEMM node, for 16-bit floats followed by the rounding cast (see gemm)."""
    out = torch_dtype_name(val.dtype)
    prod = gemm(low, val, a, b, batched)
    if prod.dtype == out:
        return prod
    return low.pointwise(prod.shape, out, cast(prod.load(ivars(len(prod.shape))), out))


def gemm(low: Lowering, val, a: TensorRef, b: TensorRef, batched: bool) -> TensorRef:
    """A GEMM node computing a @ b, accumulated in float32 for 16-bit float operands (float64 for float64). The
    operands stay in their own dtype (each backend reads them as it can: Triton's tl.dot natively, the C++
    backend widens them for sgemm); the product is returned in the accumulation dtype and the caller rounds it
    once, after any epilogue it adds."""
    out = torch_dtype_name(val.dtype)
    compute = ir.compute_dtype(out)
    if compute not in ("float32", "float64"):
        raise NotImplementedError(f"matrix product in {out}")
    shape = shape_of(low, val)
    ga, gb = _gemm_operand(low, a, batched), _gemm_operand(low, b, batched)
    buf = low.new_buffer(compute, shape)
    m, n, k = a.shape[-2], b.shape[-1], a.shape[-1]
    folded = _one_column_fold(ga, gb, shape[0], m, k) if batched and sympy.sympify(n) == 1 else None
    if folded is not None:  # the output's memory is the same: [batch, m, 1] is [1, batch, m]
        gemm = ir.Gemm(*folded, sympy.Integer(1), shape[0], m, k, acc_dtype=compute)
    else:
        gemm = ir.Gemm(ga, gb, shape[0] if batched else sympy.Integer(1), m, n, k, acc_dtype=compute)
    low.nodes.append(ir.Node(low.fresh("n"), "gemm", buf, gemm=gemm, source=low.source()))
    return identity_ref(buf)


@RULES.rule(aten.mm)
def _aten_mm(low, node, val, a, b):
    return _mm(low, val, a, b, batched=False)


@RULES.rule(aten.bmm)
def _aten_bmm(low, node, val, a, b):
    return _mm(low, val, a, b, batched=True)


@RULES.rule(aten.addmm)
def _addmm(low, node, val, bias, a, b, beta=1, alpha=1):
    """bias + a @ b as a GEMM and a pointwise add; fusion turns the add into the GEMM's epilogue. For 16-bit
    floats the add runs on the float32 product and rounds once, like PyTorch's addmm."""
    prod = gemm(low, val, a, b, batched=False)
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    acc = prod.dtype
    p = prod.load(ivars(2))
    if alpha != 1:
        p = ir.Op(acc, "mul", (p, value_at(alpha, shape, acc)))
    bv = value_at(bias, shape, acc)
    if beta != 1:
        bv = ir.Op(acc, "mul", (bv, value_at(beta, shape, acc)))
    return low.pointwise(shape, out, cast(ir.Op(acc, "add", (p, bv)) if beta != 0 else p, out))


@RULES.rule(aten.scalar_tensor)
def _scalar_tensor(low, node, val, value, **kw):
    out = torch_dtype_name(val.dtype)
    return low.pointwise((), out, value_at(value, (), out))


@RULES.rule(aten.full)
def _full(low, node, val, size, value, **kw):
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    return low.pointwise(shape, out, value_at(value if not isinstance(value, float) or math.isfinite(value)
                                            else value, shape, out))


@RULES.rule(aten.split_with_sizes, aten.split)
def _split(low, node, val, x, sizes, dim=0):
    """A list of slice views; FX's getitem picks one."""
    dim %= len(x.shape)
    if isinstance(sizes, (int, sympy.Expr)):
        n = len(val)
        sizes = [sizes] * n
    views, start = [], sympy.Integer(0)
    for k, size in enumerate(sizes):
        shape = shape_of(low, val[k])
        views.append(view_of(x, shape, [ir.ivar(d) + start if d == dim else ir.ivar(d) for d in range(len(shape))]))
        start = start + size
    return views
