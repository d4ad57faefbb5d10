"""Lowering rules for tensors created from sizes and scalars (arange, full, zeros, ones, *_like, new_*).

Sizes may be symbolic: the values are index expressions or constants over the output position, so they cost
nothing once fusion inlines them into their readers.
"""

from __future__ import annotations

import sympy
import torch

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower.core import register, torch_dtype_name
from tcexport.exporter.lower.ops import _cast, _idx, _is_float, _shape, _value

aten = torch.ops.aten


@register(aten.arange)
def _arange(low, node, val, *args, **kw):
    """arange(end) / arange(start, end[, step]): out[i] = start + i * step."""
    start, step = (0, args[2] if len(args) > 2 else 1) if len(args) < 2 else (args[0], args[2] if len(args) > 2 else 1)
    start, step = kw.get("start", start), kw.get("step", step)
    shape, out = _shape(low, val), torch_dtype_name(val.dtype)
    i = ir.ivar(0)
    if _is_float(out) or isinstance(start, float) or isinstance(step, float):
        pos = _cast(ir.IndexValue("int64", i), out)
        body = ir.Op(out, "add", (_value(start, shape, out), ir.Op(out, "mul", (pos, _value(step, shape, out)))))
        return low.pointwise(shape, out, body)
    expr = sympy.sympify(start) + sympy.sympify(step) * i
    return low.pointwise(shape, out, _cast(ir.IndexValue("int64", expr), out))


def _filled(low, val, value):
    shape, out = _shape(low, val), torch_dtype_name(val.dtype)
    return low.pointwise(shape, out, _value(value, shape, out))


@register(aten.full_like, aten.new_full)
def _full_like(low, node, val, x, *args, **kw):
    value = args[-1] if args else kw["fill_value"]
    return _filled(low, val, value)


@register(aten.zeros, aten.zeros_like, aten.new_zeros, aten.empty, aten.empty_like, aten.new_empty,
          aten.empty_strided, aten.new_empty_strided)
def _zeros(low, node, val, *args, **kw):
    return _filled(low, val, 0)


@register(aten.ones, aten.ones_like, aten.new_ones)
def _ones(low, node, val, *args, **kw):
    return _filled(low, val, 1)


@register(aten.copy)
def _copy_into(low, node, val, dst, src, non_blocking=False):
    """Functional copy: the result has dst's shape and dtype and src's values (broadcast)."""
    shape, out = _shape(low, val), torch_dtype_name(val.dtype)
    return low.pointwise(shape, out, _value(src, shape, out))


@register(aten.tril, aten.triu)
def _tri(low, node, val, x, diagonal=0):
    """Keep x where (col - row) <= diagonal (tril) or >= diagonal (triu), else 0."""
    shape, out = _shape(low, val), torch_dtype_name(val.dtype)
    rank = len(shape)
    d = ir.IndexValue("int64", ir.ivar(rank - 1) - ir.ivar(rank - 2))
    keep = ir.Op("bool", "le" if node.target is aten.tril.default else "ge", (d, ir.Const("int64", int(diagonal))))
    return low.pointwise(shape, out, ir.Op(out, "where", (keep, x.load(_idx(rank)), _value(0, shape, out))))


@register(aten._assert_tensor_metadata, aten._assert_scalar, aten._assert_async, aten.sym_constrain_range_for_size,
          aten.sym_constrain_range)
def _no_op_check(low, node, val, *args, **kw):
    """Checks export already proved (or that guards enforce at load time): nothing to compute."""
    return None
