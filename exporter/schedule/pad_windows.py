"""Zero-padded copies for the CPU's window sums: a depthwise convolution is lowered (lower/conv.py) as one pointwise
node summing its taps, each tap ``where(inside, x[clamped position], 0)``. The C++ renderer runs the positions where
no bound can bind as a vector loop (cpu/interior.py), but along a 7- or 14-wide row most positions are within a
5x5 window's reach of an edge, and each of those runs all taps as scalar code with clamps and selects: MobileNetV3's
four 5x5 layers at 7x7 and 14x14 took 40% of its call at batch 8 (1 thread).

Here such a node instead reads a copy of x with the padding written out as zeros, ``xp[..., j] = where(inside,
x[..., j - lo], 0)``: its taps become plain loads at fixed offsets, every position of its rows is interior, and the
copy (one pass over x, its own edges cheap: one select per element) costs less than the selects it removes. Exact:
a tap's condition is precisely its clamped dims' bounds, and xp is 0 exactly outside them. The GPU keeps the
original kernel (a masked Triton load costs nothing per lane; a copy would cost a launch).
"""

from __future__ import annotations

import dataclasses

import sympy

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import Kernel, Stage
from tcexport.exporter.schedule.fuse import new_kernel

MIN_TAPS = 4        # fewer taps of one value than this (a pooling's 2x2, an im2col's one) are not worth a copy
MIN_EDGE_TAPS = 2   # ... nor fewer scalar taps per output than this: the taps times the share of a row's positions
# that reach the padding (the renderer's edge path). MobileNetV3 at batch 8, 1 thread: its 5x5 layers at 7 and 14
# wide (14 and 7 per output) ran 2.1x faster with their copies; its 3x3 layers at 28 and 56 wide (0.6 and 0.3)
# lost more to the copy than they gained, 58.6 against 54.2 ms a call with every window copied. EfficientNet-b0's
# 5x5 layer at 28 wide (3.6) gained: the model 0.95 of a call on 2 threads at batch 1 and 8 with 2 here instead
# of 4 (python -m bench.package_ab); 1 (its 3x3 at 14 too, 1.3) measured the same as 2.


def pad_windows(prog: ir.Program, kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` with each eligible window sum reading zero-padded copies made just before it (a new list;
    ``prog`` gains the copies' buffers; nodes shared with other schedules are replaced, never changed)."""
    out = []
    for k in kernels:
        if k.kind != "loops":
            out.append(k)
            continue
        pads, stages = [], []
        for s in k.stages:
            copies, body = _padded(prog, s.node, len(pads)) if s.node.kind == "pointwise" else ([], None)
            for c in copies:
                pad = new_kernel(c, 0)
                pad.name = f"{k.name}_pad{len(pads) or ''}"
                pads.append(pad)
            stages.append(Stage(dataclasses.replace(s.node, body=body), s.level, s.var_map) if copies else s)
        out += pads + ([dataclasses.replace(k, stages=stages)] if pads else [k])
    return out


def _padded(prog: ir.Program, node: ir.Node, count: int) -> tuple[list[ir.Node], ir.Value | None]:
    """(the copies' nodes, ``node``'s body reading them): one copy per group of at least MIN_TAPS taps that
    select the same value of one buffer (x, or an activation of it inlined into the taps), where enough of the
    taps are at the rows' edges; ([], None) when no group is."""
    taps = {id(v): t for v in ir.walk(node.body) if (t := tap(prog, v)) is not None}
    groups: dict = {}
    for key, t in taps.items():
        groups.setdefault(t.template, []).append(key)
    width = sympy.sympify(node.ranges[-1]) if node.ranges else sympy.Integer(1)
    ranges = dict(zip((ir.ivar(d) for d in range(len(node.ranges))), node.ranges))
    copies, reads = [], {}
    for template, keys in groups.items():
        group = [taps[k] for k in keys]
        src = prog.buffers[group[0].buffer]
        pads = _pads(group, src, ranges)
        if pads is None or len(group) < MIN_TAPS or not width.is_Integer:
            continue
        lo, hi = pads
        order = _order(group[0].raw, ranges)
        if len(group) * (lo[order[-1]] + hi[order[-1]]) < MIN_EDGE_TAPS * int(width):
            continue  # too few of the row's taps reach its edges (the node's last dim walks the copy's last dim)
        name = f"{node.out.name}_padded{count + len(copies) or ''}"
        shape = tuple(src.shape[d] + lo[d] + hi[d] for d in order)
        buf = ir.Buffer(name, template.dtype, shape, "temp")
        prog.buffers[name] = buf
        copies.append(ir.Node(f"{node.name}_pad{len(copies) or ''}", "pointwise", buf,
                              body=_copy(template, src, lo, hi, order), source=node.source))
        def in_copy(index, buf=buf, lo=lo, order=order):
            return ir.Load(buf.dtype, buf.name, tuple(sympy.sympify(index[d]) + lo[d] for d in order))

        for t in group:
            reads[id(t.where)] = in_copy(t.raw)
        for v in ir.walk(node.body):  # the taps that need no select (a window's centre) read the copy too
            read = single_read(prog, v) if id(v) not in reads else None
            if read is not None and read[0] == group[0].buffer and read[2] == template:
                reads[id(v)] = in_copy(read[1])
    if not copies:
        return [], None
    return copies, _map_taps(node.body, lambda v: reads.get(id(v), v))


def _pads(group: list, src: ir.Buffer, ranges: dict) -> tuple[list, list] | None:
    """The zeros each dim of ``src`` needs before and after for every tap of ``group`` to read inside."""
    lo, hi = [0] * len(src.shape), [0] * len(src.shape)
    for t in group:
        for d in t.clamped:
            ends = _ends(t.raw[d], ranges)
            if ends is None or not sympy.sympify(src.shape[d]).is_Integer:
                return None
            lo[d], hi[d] = max(lo[d], -ends[0]), max(hi[d], ends[1] - (int(src.shape[d]) - 1))
    return (lo, hi) if any(lo) or any(hi) else None


def _map_taps(v: ir.Value, fn) -> ir.Value:
    """``fn`` applied top-down: a tap is replaced whole, before its own load is visited."""
    r = fn(v)
    if r is not v:
        return r
    if isinstance(v, ir.Op):
        return dataclasses.replace(v, args=tuple(_map_taps(a, fn) for a in v.args))
    return v


@dataclasses.dataclass(frozen=True)
class Tap:
    where: ir.Op        # the select itself
    buffer: str         # the one buffer its value reads
    raw: tuple          # the index it reads at, without its clamps
    clamped: frozenset  # the dims that had one
    template: ir.Value  # its value with the reads at (i0, i1, ...): taps with one template share a copy


def tap(prog: ir.Program, v) -> Tap | None:
    """``where(inside, f(x[clamped]), 0)``, f made of operations on x at that one index, whose condition is
    exactly its clamps' bounds (lower/conv.py's window_load; f: an activation inlined into the window), else
    None."""
    if not (isinstance(v, ir.Op) and v.op == "where" and isinstance(v.args[2], ir.Const) and v.args[2].value == 0):
        return None
    cond, val = v.args[0], v.args[1]
    read = single_read(prog, val)
    if read is None:
        return None
    buffer, index, template = read
    shape = prog.buffers[buffer].shape
    raw, bounds, clamped = [], set(), set()
    for d, (e, size) in enumerate(zip(index, shape)):
        e, r = sympy.sympify(e), _stripped(e, size)
        raw.append(r)
        while e != r:
            clamped.add(d)
            bounds.add(("ge" if isinstance(e, sympy.Max) else "lt", r))
            e = next(a for a in e.args if a != 0 and a != sympy.sympify(size) - 1)
    if not bounds or _conditions(cond, shape, raw) != bounds:
        return None
    return Tap(v, buffer, tuple(raw), frozenset(clamped), template)


def single_read(prog: ir.Program, val: ir.Value) -> tuple[str, tuple, ir.Value] | None:
    """(buffer, index, template) when ``val`` is operations on one element of one buffer (read at ``index``; the
    template is ``val`` with that read at (i0, i1, ...)), else None."""
    values = list(ir.walk(val))
    loads = [x for x in values if isinstance(x, ir.Load)]
    if not loads or any(isinstance(x, (ir.LoadIndirect, ir.IndexValue)) for x in values) or \
            len({(x.buffer, x.index) for x in loads}) != 1 or loads[0].buffer not in prog.buffers:
        return None
    buffer, index = loads[0].buffer, loads[0].index
    own = tuple(ir.ivar(d) for d in range(len(index)))
    return buffer, index, ir.map_values(val, lambda x: ir.Load(x.dtype, x.buffer, own) if isinstance(x, ir.Load) else x)


def _stripped(e, size):
    """``e`` without lower/conv.window_load's clamps: Max(0, .) and Min(size - 1, .), in either order."""
    e = sympy.sympify(e)
    while True:
        if isinstance(e, sympy.Max) and len(e.args) == 2 and sympy.Integer(0) in e.args:
            e = next(a for a in e.args if a != 0)
        elif isinstance(e, sympy.Min) and len(e.args) == 2 and sympy.sympify(size) - 1 in e.args:
            e = next(a for a in e.args if a != sympy.sympify(size) - 1)
        else:
            return e


def _conditions(cond: ir.Value, shape: tuple, raw: list) -> set | None:
    """The bounds a conjunction checks, as ("ge", e) for e >= 0 and ("lt", e) for e < its dim's size; None when
    a term is anything else."""
    if isinstance(cond, ir.Op) and cond.op == "logical_and":
        parts = [_conditions(a, shape, raw) for a in cond.args]
        return None if None in parts else parts[0] | parts[1]
    if not (isinstance(cond, ir.Op) and cond.op in ("ge", "lt") and isinstance(cond.args[0], ir.IndexValue)):
        return None
    e, bound = cond.args[0].expr, cond.args[1]
    if cond.op == "ge" and isinstance(bound, ir.Const) and bound.value == 0 and e in raw:
        return {("ge", e)}
    if cond.op == "lt" and isinstance(bound, ir.IndexValue) and any(
            e == r and sympy.sympify(bound.expr) == sympy.sympify(s) for r, s in zip(raw, shape)):
        return {("lt", e)}
    return None


def _ends(e, ranges: dict) -> tuple[int, int] | None:
    """The least and greatest value of an affine ``e`` over the node's index ranges (static ones), else None."""
    e = sympy.expand(e)
    if not e.free_symbols:
        return int(e), int(e)
    if not e.is_polynomial(*e.free_symbols) or sympy.Poly(e, *e.free_symbols).total_degree() > 1:
        return None
    least, most = e, e
    for s in e.free_symbols:
        size = sympy.sympify(ranges.get(s))
        if s not in ranges or not size.is_Integer:
            return None
        c = e.coeff(s)
        least = least.subs(s, 0 if c >= 0 else size - 1)
        most = most.subs(s, size - 1 if c >= 0 else 0)
    return (int(least), int(most)) if least.is_Integer and most.is_Integer else None


def _order(raw: tuple, ranges: dict) -> tuple:
    """The copy's dims as x's dims, in the order of the node's index variables each reads by: a window over a
    permuted x (ConvNeXt's first 7x7 depthwise layer reads its channels-last input [n, h, w, c] while it walks
    [n, c, h, w]) gets a copy laid out as the node walks it, so that its rows are contiguous where the node's are
    and the node's edge taps are along its last dim; the identity when a dim reads by other than one variable of
    its own. ConvNeXt-tiny's first one at batch 1 on 2 threads: 4.35 ms of a 72 ms call, edge path and strided
    taps; with a copy in its order 0.73 ms plus 0.22 ms for the copy, as its other stage-1 7x7 layers (0.70-0.84
    ms); the model 0.95 of a call at batch 1 and 8 (bench/results/2core-amd-epyc-2026-12-07-convnext-pad-ab.md)."""
    position = {v: k for k, v in enumerate(ranges)}  # the node's index variables, i0, i1, ...
    keys = []
    for e in raw:
        own = [v for v in sympy.sympify(e).free_symbols if v in position]
        keys.append(position[own[0]] if len(own) == 1 else None)
    if None in keys or len(set(keys)) != len(keys):
        return tuple(range(len(raw)))
    return tuple(sorted(range(len(raw)), key=keys.__getitem__))


def _copy(template: ir.Value, src: ir.Buffer, lo: list, hi: list, order: tuple) -> ir.Value:
    """xp[j...] = f(x[j - lo...]) inside x, 0 in the padding; the copy's dim k is x's dim order[k]."""
    conds, index = [], {}
    for k, d in enumerate(order):
        size, j = src.shape[d], ir.ivar(k)
        e = j - lo[d]
        if lo[d]:
            conds.append(ir.Op("bool", "ge", (ir.IndexValue("int64", j - lo[d]), ir.Const("int64", 0))))
            e = sympy.Max(e, 0)
        if hi[d]:
            conds.append(ir.Op("bool", "lt", (ir.IndexValue("int64", j - lo[d]),
                                              ir.IndexValue("int64", sympy.sympify(size)))))
            e = sympy.Min(e, size - 1)
        index[ir.ivar(d)] = e
    cond = conds[0]
    for c in conds[1:]:
        cond = ir.Op("bool", "logical_and", (cond, c))
    return ir.Op(template.dtype, "where", (cond, ir.subs_index(template, index), ir.Const(template.dtype, 0)))
