"""Lowering rules for ops that only backward graphs contain: the ``scatter`` of nll_loss's backward, a small
helper of decompositions, and (in grad_conv.py) the backward of convolution and max pooling. ``~x`` (the masks decompositions build) is ops.py's
rule in both pipelines; core.py composes these tables into TRAINING_RULES.

Each is written as a gather, as every IR node is: an output element reads the elements that contribute to it.
(The accumulating ``index_put`` an embedding's backward scatters with is index.py's, with every index_put.)
"""

from __future__ import annotations

import torch

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower.rules import RuleTable
from tcexport.exporter.lower.context import torch_dtype_name
from tcexport.exporter.lower.create import filled
from tcexport.exporter.lower.index import wrapped
from tcexport.exporter.lower.reduce import reduction
from tcexport.exporter.lower.values import cast, index_value, ivars, shape_of

aten = torch.ops.aten
RULES = RuleTable("tcexport.exporter.lower.grad")


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
