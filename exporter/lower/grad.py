"""Lowering rules for ops that only backward graphs contain: the accumulating ``index_put`` an embedding's
backward scatters with, the ``scatter`` of nll_loss's backward, a small helper of decompositions, and (in
grad_conv.py) the backward of convolution and max pooling. ``~x`` (the masks decompositions build) is ops.py's
rule in both pipelines; core.py composes these tables into TRAINING_RULES.

Each is written as a gather, as every IR node is: an output element reads the elements that contribute to it.
A scatter-add into row v sums, over every index position, the value there if its index is v (cost: rows ×
positions; an IR scatter node would make it linear in the positions).
"""

from __future__ import annotations

import sympy
import torch

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower.rules import RuleTable
from tcexport.exporter.lower.context import torch_dtype_name
from tcexport.exporter.lower.create import filled
from tcexport.exporter.lower.grad_conv import masked
from tcexport.exporter.lower.index import wrapped
from tcexport.exporter.lower.reduce import reduction
from tcexport.exporter.lower.values import cast, index_value, ivars, shape_of

aten = torch.ops.aten
RULES = RuleTable("tcexport.exporter.lower.grad")


@RULES.rule(aten.index_put)
def _index_put(low, node, val, base, indices, values, accumulate=False):
    """``base.index_put([idx], values, accumulate=True)``: row v of the result is base's row v plus the sum of
    the value rows whose index is v (negative indices wrap). The only form backward graphs produce (an
    embedding's weight gradient); other forms are not lowered."""
    if not accumulate or len(indices) != 1 or indices[0] is None:
        raise NotImplementedError("index_put other than accumulating with one index tensor on dim 0")
    idx = indices[0]
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    acc = ir.compute_dtype(out)
    p, rest = len(idx.shape), len(shape) - 1
    r_vars = [ir.rvar(k) for k in range(p)]
    target = list(idx.shape) + list(shape[1:])
    position = r_vars + [ir.ivar(1 + d) for d in range(rest)]
    offset = len(target) - len(values.shape)
    v_idx = [sympy.Integer(0) if size == 1 and target[d + offset] != 1 else position[d + offset]
             for d, size in enumerate(values.shape)]
    hit = ir.Op("bool", "eq", (wrapped(idx.load(r_vars), shape[0]), index_value(ir.ivar(0))))
    body = masked(hit, cast(values.load(v_idx), acc), acc)
    total = reduction(low, shape, acc, "sum", list(idx.shape), body).load(ivars(len(shape)))
    result = ir.Op(acc, "add", (cast(base.load(ivars(len(shape))), acc), total))
    return low.pointwise(shape, out, cast(result, out))


@RULES.rule(aten.empty_permuted)
def _empty_permuted(low, node, val, *args, **kw):
    """An uninitialised tensor (a decomposition fills it next): zeros, like the other ``empty`` ops."""
    return filled(low, val, 0)


@RULES.rule(aten.scatter)
def _scatter(low, node, val, base, dim, index, value=None, *rest, **kw):
    """``base.scatter(dim, index, value)`` with a scalar value (what nll_loss's backward builds): element i is
    ``value`` where some index entry along ``dim`` at i's other coordinates names i's position, else base's."""
    if node.target is not aten.scatter.value or rest or kw:
        raise NotImplementedError("scatter other than scatter(dim, index, scalar value)")
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    rank = len(shape)
    dim %= max(rank, 1)
    for d in range(rank):
        if d != dim and not ir.same_size(index.shape[d], shape[d]):
            raise NotImplementedError("scatter with an index smaller than the tensor outside the scattered dim")
    at = [ir.rvar(0) if d == dim else ir.ivar(d) for d in range(rank)]
    entry = index.load(at)
    entry = entry if entry.dtype == "int64" else ir.Op("int64", "cast", (entry,))
    hit = ir.Op("bool", "eq", (wrapped(entry, shape[dim]), index_value(ir.ivar(dim))))
    any_hit = reduction(low, shape, "bool", "max", [index.shape[dim]], hit).load(ivars(rank))
    body = ir.Op(out, "where", (any_hit, ir.Const(out, value), base.load(ivars(rank))))
    return low.pointwise(shape, out, body)
