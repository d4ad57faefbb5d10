"""Helpers every lowering rule shares: a node's shape over our symbols, the output position (i0, i1, ...),
operands as IR values (broadcast, cast, type promotion), sizes as index values, and views as index maps."""

from __future__ import annotations

import sympy

from tcexport.exporter.front.capture import to_sympy
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower.context import Lowering, TensorRef


def shape_of(low: Lowering, val) -> tuple:
    return tuple(to_sympy(s, low.cap.rename) for s in val.shape)


def ivars(rank: int) -> tuple:
    return tuple(ir.ivar(k) for k in range(rank))


def is_float(dtype: str) -> bool:
    return dtype in ir.FLOAT_DTYPES


def value_at(x, out_shape, dtype: str | None) -> ir.Value:
    """``x`` (a TensorRef or a Python/sympy scalar) loaded at the output position with broadcasting,
    cast to ``dtype`` when given."""
    if isinstance(x, TensorRef):
        rank, offset = len(out_shape), len(out_shape) - len(x.shape)
        idx = []
        for d, size in enumerate(x.shape):
            idx.append(sympy.Integer(0) if size == 1 and out_shape[d + offset] != 1 else ir.ivar(d + offset))
        v = x.load(idx) if rank else x.load(())
        return cast(v, dtype) if dtype else v
    if isinstance(x, sympy.Expr) and not x.is_number and not x.is_integer:
        return cast(_ratio(x), dtype or "float32")
    if isinstance(x, sympy.Expr) and not x.is_number:
        v = ir.IndexValue("int64", x)
        return cast(v, dtype) if dtype else v
    if isinstance(x, bool):
        return ir.Const(dtype or "bool", x)
    if isinstance(x, (int, float, sympy.Number)):
        x = float(x) if (dtype and is_float(dtype)) or isinstance(x, float) else int(x)
        return ir.Const(dtype or ("float32" if isinstance(x, float) else "int64"), x)
    raise NotImplementedError(f"unsupported argument {x!r}")


def _ratio(x: sympy.Expr) -> ir.Value:
    """A ratio of size expressions (a symbolic float, e.g. interpolate's scale ``in / out``) as a float64 division
    of its integer numerator and denominator: what torch computes in Python floats before the op rounds it."""
    num, den = sympy.fraction(sympy.together(x))
    if not (num.is_integer and den.is_integer):
        raise NotImplementedError(f"a symbolic scalar that is not a ratio of sizes: {x}")
    as_float = [cast(ir.IndexValue("int64", e), "float64") for e in (num, den)]
    return ir.Op("float64", "div", tuple(as_float))


def cast(v: ir.Value, dtype: str) -> ir.Value:
    return v if v.dtype == dtype else ir.Op(dtype, "cast", (v,))


PROMOTION_ORDER = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def promote(*xs) -> str:
    """Type promotion between operands (tensors win over scalars of the same category; float16 with bfloat16
    is float32, as in PyTorch)."""
    tensors = [x.dtype for x in xs if isinstance(x, TensorRef)]
    best = max(tensors, key=PROMOTION_ORDER.index) if tensors else "float32"
    if best == "bfloat16" and "float16" in tensors:
        best = "float32"
    if any(isinstance(x, float) for x in xs) and not is_float(best):
        best = "float32"
    if any(isinstance(x, int) and not isinstance(x, bool) for x in xs) and best == "bool":
        best = "int64"
    return best


def index_value(e) -> ir.Value:
    return ir.IndexValue("int64", sympy.sympify(e))


def all_of(conds: list) -> ir.Value | None:
    out = None
    for c in conds:
        out = c if out is None else ir.Op("bool", "logical_and", (out, c))
    return out


def view_of(x: TensorRef, shape, index_of_new) -> TensorRef:
    """A view whose element at the new position (i...) is x's element at ``index_of_new`` (a tuple of exprs)."""
    mapping = {ir.ivar(k): sympy.sympify(e) for k, e in enumerate(index_of_new)}
    return TensorRef(x.buffer, tuple(shape), tuple(sympy.sympify(e).xreplace(mapping) for e in x.index))


def norm_dims(dims, rank):
    if isinstance(dims, int):
        dims = [dims]
    return [d % rank for d in dims] if rank else []
