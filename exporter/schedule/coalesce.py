"""A pointwise loop over a small map runs as one loop over the map's positions: a CNN's later stages are 14x14 and
7x7, and a kernel over [batch, C, 14, 14] ran its innermost loop 14 long, one call of its body per row, gcc
vectorising it as one 8-lane vector and scalars (MobileNetV3-small at batch 8 spent 4.5 of 16 ms in such
pointwise kernels and GEMM epilogues). Where every index the kernel's stages read and write moves with its last two
loop variables only as ``c * (W * y + x)`` (the two loops step through each buffer as one run, at a stride of its
own), they are one loop of H * W positions; this repeats while the innermost loop is shorter than ``MAX_INNER``
and the loops outside still give the pool's threads ``MIN_ROWS`` pieces at the smallest batch. A read along one
of them alone (a per-row bias, a window's clamped tap) keeps the loops apart. A GEMM kernel's epilogue loops are
merged by the same test: its outer becomes the merged loops, and its stage's var_map maps the node's index
variables onto them (i0, i1, ...; cpu/codegen.py renders the epilogue from both); so are a reduction's inner
loops (a pooled mean over the map)"""

from __future__ import annotations

import dataclasses

import sympy

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import ARG_REDUCTIONS, Kernel, Stage, ovar, qvar
from tcexport.exporter.ir.loops import FloorDiv, ModularIndexing

MAX_INNER = 64  # four AVX-512 vectors of float32: longer rows already vectorise
MIN_ROWS = 16    # the loops the pool shares out stay at least this many at batch 1


def coalesce(prog: ir.Program, kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` with each pure pointwise loop kernel's, GEMM epilogue's and reduction's short innermost loops
    merged (a new list)."""
    out = []
    for k in kernels:
        if k.kind == "loops" and not k.inner and all(s.level == "row" for s in k.stages):
            outer, maps = _merged(prog, k.outer, k.stages, ovar, _pieces_stay)
            k = dataclasses.replace(k, outer=outer, stages=_with_maps(k.stages, maps))
        elif k.kind == "loops" and k.inner and not any(s.node.reduce_op in ARG_REDUCTIONS for s in k.stages):
            # a reduction's sum over the map (an arg reduction's result is its position in the nest: kept)
            inner, maps = _merged(prog, k.inner, k.stages, qvar, lambda extents: len(extents) > 1)
            k = dataclasses.replace(k, inner=inner, stages=_with_maps(k.stages, maps))
        elif k.kind == "gemm" and k.stages[0].node.body is not None:
            node = k.stages[0].node
            identity = Stage(node, "gemm", {ir.ivar(d): ir.ivar(d) for d in range(len(node.ranges))})
            ranges, maps = _merged(prog, tuple(node.ranges), [identity], ir.ivar, _pieces_stay)
            if len(ranges) < len(node.ranges):
                k = dataclasses.replace(k, outer=ranges, stages=_with_maps([identity], maps))
        out.append(k)
    return out


def _merged(prog: ir.Program, extents: tuple, stages: list, var, more) -> tuple[tuple, list[dict]]:
    """(``extents`` with the last two merged while the last is short, ``more(extents)`` allows it and every stage's
    positions stay free of a division of the merged variable; each stage's var_map onto the merged loops, whose
    variables ``var(d)`` are those of ``extents``)."""
    maps = [s.var_map for s in stages]
    while more(extents) and _short(extents[-1]):
        d = len(extents) - 2
        merged = _merge_map(d, extents[-1], var)
        trial = [{v: ir.simplify_index(sympy.sympify(e).xreplace(merged)) for v, e in m.items()} for m in maps]
        if not all(_plain(prog, s.node, m, var(d)) for s, m in zip(stages, trial)):
            break
        extents, maps = extents[:d] + (extents[d] * extents[d + 1],), trial
    return extents, maps


def _with_maps(stages: list, maps: list[dict]) -> list:
    return [Stage(s.node, s.level, m) for s, m in zip(stages, maps)]


def _pieces_stay(extents: tuple) -> bool:
    """Loops the pool shares out (all but the innermost): after a merge still MIN_ROWS pieces at batch 1."""
    return len(extents) > 2 and _enough(extents[:-2])


def _short(extent) -> bool:
    e = sympy.sympify(extent)
    return e.is_Integer and 1 < int(e) < MAX_INNER  # an empty dim (a zero-size tensor) is left alone


def _enough(outer) -> bool:
    """Whether loops of these extents are MIN_ROWS pieces at least, a size symbol (the batch) counted at 1."""
    rows = sympy.sympify(ir.product(outer))
    rows = sympy.sympify(rows.xreplace({v: sympy.Integer(1) for v in rows.free_symbols}))
    return rows.is_Integer and int(rows) >= MIN_ROWS


def _merge_map(d: int, width, var) -> dict:
    """Loop variables d and d + 1 (width ``width``) as one variable, the new d: y = q // W, x = q % W."""
    q = var(d)
    return {var(d): FloorDiv(q, width), var(d + 1): ModularIndexing(q, 1, width)}


def _plain(prog: ir.Program, node: ir.Node, var_map: dict, q) -> bool:
    """Whether every position ``node`` reads and writes under ``var_map`` is free of a division of ``q``."""
    body = ir.subs_index(node.body, var_map) if node.body is not None else None
    store = node.out.flat_index([var_map.get(ir.ivar(d), 0) for d in range(len(node.ranges))])
    exprs = [store]
    for v in ir.walk(body) if body is not None else ():
        if isinstance(v, ir.Load):
            exprs.append(prog.buffers[v.buffer].flat_index(list(v.index)))
        elif isinstance(v, ir.LoadIndirect):
            exprs += [sympy.sympify(e) for e in v.index]
        elif isinstance(v, ir.IndexValue):
            exprs.append(sympy.sympify(v.expr))
    return not any(_divides(e, q) for e in exprs)


def _divides(e, q) -> bool:
    return any(q in a.free_symbols for a in sympy.sympify(e).atoms(FloorDiv, ModularIndexing, sympy.Min, sympy.Max,
                                                                      sympy.floor, sympy.Mod))
