"""Lowering rules for data-dependent indexing (embedding, index_select, gather, index) and concatenation.

An index read from a tensor becomes a LoadIndirect: the gathered buffer's index uses ``x0, x1, ...`` bound to
the index values, and the kernel range-checks those dims (an out-of-range index fails the run with a message).
Negative indices wrap where PyTorch wraps them (``index``, ``index_put``); elsewhere they are out of range, as in
eager. ``index_put`` is written as a gather too, every element reading what lands on it: a static KV cache's
write at ``cache_position`` (the state of a stateful package, front/state.py) is one of these.
"""

from __future__ import annotations

import sympy
import torch

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower.rules import RuleTable
from tcexport.exporter.lower.context import Lowering, TensorRef, torch_dtype_name
from tcexport.exporter.lower.reduce import reduction
from tcexport.exporter.lower.values import cast, index_value, ivars, shape_of

aten = torch.ops.aten
RULES = RuleTable("tcexport.exporter.lower.index")


def _load_at(ref: TensorRef, out_shape, first_var: int) -> ir.Value:
    """``ref`` read at output dims ``first_var...``, broadcasting its leading and size-1 dims."""
    offset = len(out_shape) - len(ref.shape)
    idx = [sympy.Integer(0) if size == 1 and out_shape[d + offset] != 1 else ir.ivar(first_var + d + offset)
           for d, size in enumerate(ref.shape)]
    return ref.load(idx)


def _int64(v: ir.Value) -> ir.Value:
    return v if v.dtype == "int64" else ir.Op("int64", "cast", (v,))


def wrapped(v: ir.Value, size) -> ir.Value:
    """Python-style negative indices: v < 0 means v + size."""
    v = _int64(v)
    neg = ir.Op("bool", "lt", (v, ir.Const("int64", 0)))
    return ir.Op("int64", "where", (neg, ir.Op("int64", "add", (v, ir.IndexValue("int64", size))), v))


def _gather_node(low: Lowering, val, x: TensorRef, index_of_out, sources) -> TensorRef:
    """out[i...] = x[index_of_out] where ``index_of_out`` (x's view dims) may use xk = sources[k]."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    if not x.is_identity():
        x = low.realize(x)
    body = ir.LoadIndirect(x.dtype, x.buffer.name, tuple(sympy.sympify(e) for e in index_of_out),
                           tuple(_int64(s) for s in sources), origin=low.source())
    return low.pointwise(shape, out, body if body.dtype == out else ir.Op(out, "cast", (body,)))


@RULES.rule(aten.embedding)
def _embedding(low, node, val, weight, indices, padding_idx=-1, *rest):
    """out[idx..., j] = weight[indices[idx...], j]."""
    n = len(indices.shape)
    src = indices.load(ivars(n))
    return _gather_node(low, val, weight, (ir.xvar(0), ir.ivar(n)), [src])


@RULES.rule(aten.index_select)
def _index_select(low, node, val, x, dim, index):
    dim %= max(len(x.shape), 1)
    at = (ir.ivar(dim) if len(val.shape) else sympy.Integer(0),)  # a 0-d x gives a 0-d result
    src = index.load(at) if index.shape else index.load(())
    pos = [ir.xvar(0) if d == dim else ir.ivar(d) for d in range(len(x.shape))]
    return _gather_node(low, val, x, pos, [src])


@RULES.rule(aten.gather)
def _gather(low, node, val, x, dim, index, sparse_grad=False):
    dim %= max(len(x.shape), 1)
    src = index.load(ivars(len(index.shape)))
    pos = [ir.xvar(0) if d == dim else ir.ivar(d) for d in range(len(x.shape))]
    return _gather_node(low, val, x, pos, [src])


@RULES.rule(aten.index)
def _index(low, node, val, x, indices):
    """Advanced indexing with integer index tensors (None keeps a dim). The index tensors broadcast to a
    shape B; B replaces the indexed dims in place when they are adjacent, else it comes first (NumPy rule)."""
    indices = list(indices) + [None] * (len(x.shape) - len(indices))
    used = [d for d, t in enumerate(indices) if t is not None]
    for d in used:
        if indices[d].dtype in ("bool", "uint8"):
            raise NotImplementedError("boolean mask indexing (its result size depends on the data)")
    out_shape = shape_of(low, val)
    b_rank = max(len(indices[d].shape) for d in used)
    adjacent = used == list(range(used[0], used[-1] + 1))
    b_first = used[0] if adjacent else 0
    b_shape = out_shape[b_first:b_first + b_rank]
    pos, sources, k = [], [], b_first + b_rank
    for d in range(len(x.shape)):
        if indices[d] is None:
            pos.append(ir.ivar(d if adjacent and d < used[0] else k))
            k += 0 if adjacent and d < used[0] else 1
        else:
            sources.append(wrapped(_load_at(indices[d], b_shape, b_first), x.shape[d]))
            pos.append(ir.xvar(len(sources) - 1))
    return _gather_node(low, val, x, pos, sources)


@RULES.rule(aten.cat)
def _cat(low, node, val, tensors, dim=0):
    """A chain of selects on the position along ``dim``; each part is read at a clamped index so the branch
    not taken never reads outside its buffer."""
    shape, out = shape_of(low, val), torch_dtype_name(val.dtype)
    parts = [t for t in tensors if not (len(t.shape) == 1 and t.shape[0] == 0)] or list(tensors[:1])
    dim %= len(shape)
    starts, start = [], sympy.Integer(0)
    for t in parts:
        starts.append(start)
        start = start + t.shape[dim]
    i = ir.ivar(dim)
    body = None
    for t, s0 in reversed(list(zip(parts, starts))):
        local = i - s0
        if s0 != 0:
            local = sympy.Max(local, 0)
        if body is not None:
            local = sympy.Min(local, t.shape[dim] - 1)
        idx = [local if d == dim else ir.ivar(d) for d in range(len(shape))]
        v = t.load(idx)
        v = v if v.dtype == out else ir.Op(out, "cast", (v,))
        if body is None:
            body = v
        else:
            cond = ir.Op("bool", "lt", (ir.IndexValue("int64", i), ir.IndexValue("int64", s0 + t.shape[dim])))
            body = ir.Op(out, "where", (cond, v, body))
    return low.pointwise(shape, out, body)


@RULES.rule(aten.index_put)
def _index_put(low, node, val, base, indices, values, accumulate=False):
    if accumulate:
        return _index_put_accumulate(low, val, base, indices, values)
    return _index_put_assign(low, val, base, indices, values)


def _index_put_accumulate(low, val, base, indices, values):
    """``base.index_put([idx], values, accumulate=True)``: row v of the result is base's row v plus the sum of
    the value rows whose index is v (negative indices wrap): what an embedding's weight gradient builds. Cost:
    rows × positions (an IR scatter node would make it linear in the positions)."""
    if len(indices) != 1 or indices[0] is None:
        raise NotImplementedError("accumulating index_put other than with one index tensor on dim 0")
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
    body = ir.Op(acc, "where", (hit, cast(values.load(v_idx), acc), ir.Const(acc, 0)))
    total = reduction(low, shape, acc, "sum", list(idx.shape), body).load(ivars(len(shape)))
    result = ir.Op(acc, "add", (cast(base.load(ivars(len(shape))), acc), total))
    return low.pointwise(shape, out, cast(result, out))


def _index_put_assign(low, val, base, indices, values):
    """``base[..., idx, ...] = values`` with one 1-D index tensor on dim d (the other dims whole): a static
    cache written at ``cache_position``. First ``last[l]``, the last position j with idx[j] == l (-1: none), a
    max over the T positions for each of the L rows (L × T compares, not one search per element); then each
    element is values' row last[l] where there is one, else base's. Every index is range-checked (a position
    outside the cache fails the call, as eager raises), and an element's new value never depends on another
    element's old one, so the loader may update a state in place (front/state.py)."""
    used = [d for d, t in enumerate(indices) if t is not None]
    if len(used) != 1 or len(indices[used[0]].shape) != 1 or indices[used[0]].dtype in ("bool", "uint8"):
        raise NotImplementedError("index_put other than with one 1-D integer index tensor (the other dims whole)")
    d = used[0]
    idx, shape, out = indices[d], shape_of(low, val), torch_dtype_name(val.dtype)
    if not base.is_identity():
        base = low.realize(base)
    rows, count = shape[d], idx.shape[0]
    position = wrapped(idx.load((ir.rvar(0),)), rows)
    # reading base at each position range-checks it (LoadIndirect); the value read is not used
    probe = ir.LoadIndirect(base.dtype, base.buffer.name,
                            tuple(ir.xvar(0) if k == d else sympy.Integer(0) for k in range(len(shape))),
                            (position,), origin=low.source())
    hit = ir.Op("int64", "where", (ir.Op("bool", "eq", (position, index_value(ir.ivar(0)))),
                                   index_value(ir.rvar(0)), ir.Const("int64", -1)))
    checked = ir.Op("int64", "where", (ir.Op("bool", "eq", (probe, probe)), hit, hit))
    last = reduction(low, (rows,), "int64", "max", (count,), checked).load((ir.ivar(d),))
    found = ir.Op("bool", "ge", (last, ir.Const("int64", 0)))
    row = ir.Op("int64", "where", (found, last, ir.Const("int64", 0)))
    target = list(shape[:d]) + [count] + list(shape[d + 1:])
    offset = len(target) - len(values.shape)
    v_idx, indirect = [], False
    for k, size in enumerate(values.shape):
        if size == 1 and target[k + offset] != 1:
            v_idx.append(sympy.Integer(0))
        elif k + offset == d:
            v_idx.append(ir.xvar(0))
            indirect = True
        else:
            v_idx.append(ir.ivar(k + offset))
    new = values.load(v_idx)  # through the view: the new rows of a KV cache are read where the projection left them
    if indirect:
        new = ir.LoadIndirect(new.dtype, new.buffer, new.index, (row,), origin=low.source())
    old = base.load(ivars(len(shape)))
    return low.pointwise(shape, out, ir.Op(out, "where", (found, cast(new, out), cast(old, out))))
