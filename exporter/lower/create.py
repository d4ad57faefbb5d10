"""Lowering rules for tensors created from sizes and scalars (arange, full, zeros, ones, *_like, new_*).

Sizes may be symbolic: the values are index expressions or constants over the output position, so they cost
nothing once fusion inlines them into their readers.
"""

from __future__ import annotations

import sympy
import torch

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower.rules import RuleTable
from tcexport.exporter.lower.context import torch_dtype_name
from tcexport.exporter.lower.values import cast, is_float, ivars, shape_of, value_at

aten = torch.ops.aten
RULES = RuleTable("tcexport.exporter.lower.create")


@RULES.rule(aten.arange)
def _arange(low, node, val, *args, **kw):
    """arange(end) / arange(start, end[, step]): out[i] = start + i * step."""
    start, step = (0, args[2] if len(args) > 2 else 1) if len(args) < 2 else (args[0], args[2] if len(args) > 2 else 1)
    start, step = kw.get("start", start), kw.get("step", step)
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    i = ir.ivar(0)
    if is_float(out) or isinstance(start, float) or isinstance(step, float):
        pos = cast(ir.IndexValue("int64", i), out)
        body = ir.Op(out, "add", (value_at(start, shape, out), ir.Op(out, "mul", (pos, value_at(step, shape, out)))))
        return low.pointwise(shape, out, body)
    expr = sympy.sympify(start) + sympy.sympify(step) * i
    return low.pointwise(shape, out, cast(ir.IndexValue("int64", expr), out))


def filled(low, val, value):
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    return low.pointwise(shape, out, value_at(value, shape, out))


@RULES.rule(aten.full_like, aten.new_full)
def _full_like(low, node, val, x, *args, **kw):
    value = args[-1] if args else kw["fill_value"]
    return filled(low, val, value)


@RULES.rule(aten.zeros, aten.zeros_like, aten.new_zeros, aten.empty, aten.empty_like, aten.new_empty,
          aten.empty_strided, aten.new_empty_strided)
def _zeros(low, node, val, *args, **kw):
    return filled(low, val, 0)


@RULES.rule(aten.ones, aten.ones_like, aten.new_ones)
def _ones(low, node, val, *args, **kw):
    return filled(low, val, 1)


@RULES.rule(aten.copy)
def _copy_into(low, node, val, dst, src, non_blocking=False):
    """Functional copy: the result has dst's shape and dtype and src's values (broadcast)."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    return low.pointwise(shape, out, value_at(src, shape, out))


@RULES.rule(aten.tril, aten.triu)
def _tri(low, node, val, x, diagonal=0):
    """Keep x where (col - row) <= diagonal (tril) or >= diagonal (triu), else 0."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    rank = len(shape)
    d = ir.IndexValue("int64", ir.ivar(rank - 1) - ir.ivar(rank - 2))
    keep = ir.Op("bool", "le" if node.target is aten.tril.default else "ge", (d, ir.Const("int64", int(diagonal))))
    return low.pointwise(shape, out, ir.Op(out, "where", (keep, x.load(ivars(rank)), value_at(0, shape, out))))


@RULES.rule(aten._assert_tensor_metadata, aten._assert_scalar, aten._assert_async, aten.sym_constrain_range_for_size,
          aten.sym_constrain_range)
def _no_op_check(low, node, val, *args, **kw):
    """Checks export already proved (or that guards enforce at load time): nothing to compute."""
    return None
