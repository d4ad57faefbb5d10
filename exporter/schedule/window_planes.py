"""Short rows of a window sum computed along its padded input's rows: a depthwise convolution over a 7- or
14-wide map (MobileNetV3's, EfficientNet's and ConvNeXt's last stages) reads a zero-padded copy of its input
(pad_windows.py) as plain loads at fixed offsets, but its rows are shorter than one AVX-512 vector: gcc 12 runs a
14-wide row as one 8-lane vector and scalars, a 7-wide one as scalars (MobileNetV3-small at batch 8 spent 29% of
its call in four such layers, at 12 GFLOP/s).

Output (y, x) of a stride-s window reads the copy at (s*y + a, s*x + b), which is position s*q + a*P + b of the
copy's rows laid end to end (P its padded width, q = y*P + x). So the sum is computed for every q of one plane,
one long loop that vectorises whole (contiguous at stride 1), into a temp of the plane's (H - 1)*P + W positions;
the P - W positions past each row's end are computed too (reads inside the copy, results never used; at stride 2
that is more than half of them, still faster than scalar rows), and the window's own output is then a copy of
each row's first W positions. The GPU keeps the original kernel.
"""

from __future__ import annotations

import dataclasses

import sympy

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import Kernel, Stage
from tcexport.exporter.ir.loops import FloorDiv, ModularIndexing
from tcexport.exporter.schedule.fuse import new_kernel
from tcexport.exporter.schedule.pad_windows import MIN_TAPS

MAX_WIDTH = 15  # rows at least one vector wide already vectorise along themselves


def window_planes(prog: ir.Program, kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` with each short-row window sum over padded copies computed by a plane kernel placed before
    its own, whose stage becomes the copy out of the plane (a new list; ``prog`` gains the planes' buffers)."""
    out = []
    for k in kernels:
        planes, stages = [], []
        made_here = {s.node.out.name for s in k.stages}  # the plane runs before k: it must not read these
        for s in k.stages if k.kind == "loops" else ():
            found = _plane(prog, s.node)
            if found is None or ir.reads(found[0].body) & made_here:
                stages.append(s)
                continue
            plane, copy = found
            prog.buffers[plane.out.name] = plane.out
            kernel = new_kernel(plane, 0)
            kernel.name = f"{k.name}_plane{len(planes) or ''}"
            planes.append(kernel)
            stages.append(Stage(copy, s.level, s.var_map))
        out += planes + ([dataclasses.replace(k, stages=stages)] if planes else [k])
    return out


def _plane(prog: ir.Program, node: ir.Node) -> tuple[ir.Node, ir.Node] | None:
    """(the plane's node, the copy that replaces ``node``) when ``node`` is a window sum whose every read that
    moves with its last two dims is a tap (s*y + a, s*x + b; one stride s, a, b >= 0) of buffers of one width
    P > W, its rows shorter than a vector (pad_windows' copies make its taps such reads); else None."""
    if node.kind != "pointwise" or len(node.ranges) < 3 or node.body is None:
        return None
    r = len(node.ranges)
    height, width = sympy.sympify(node.ranges[-2]), sympy.sympify(node.ranges[-1])
    if not (height.is_Integer and width.is_Integer) or int(width) > MAX_WIDTH or int(height) < 2:
        return None
    y, x = ir.ivar(r - 2), ir.ivar(r - 1)
    pitch, stride, taps = None, None, {}  # each read that moves with y and x -> its (s, a, b)
    for v in ir.walk(node.body):
        if isinstance(v, (ir.LoadIndirect, ir.IndexValue)):
            if {y, x} & _symbols(v):
                return None
            continue
        if not isinstance(v, ir.Load) or not {y, x} & _symbols(v):
            continue
        buf = prog.buffers[v.buffer]
        offsets = _tap_offsets(v.index, y, x)
        p = sympy.sympify(buf.shape[-1]) if len(buf.shape) >= 2 else None
        # a, b >= 0: the plane's first position reads inside; its last reads what output (H-1, W-1) read, and
        # the positions past a row's end read on into the next rows, never past that
        if offsets is None or min(offsets[1:]) < 0 or p is None or not p.is_Integer or \
                (pitch is not None and (p, offsets[0]) != (pitch, stride)):
            return None
        pitch, stride = p, offsets[0]
        taps[v] = offsets
    if pitch is None or int(pitch) <= int(width) or len(taps) < MIN_TAPS:
        return None  # a few shifted reads (a rotary embedding's halves) are no window: their rows stay
    P, H, W = int(pitch), int(height), int(width)
    length = (H - 1) * P + W
    q = ir.ivar(r - 2)
    name = f"{node.out.name}_plane"
    buf = ir.Buffer(name, node.out.dtype, tuple(node.ranges[:-2]) + (length,), "temp")  # prog's once taken

    def along_rows(v):
        if not (isinstance(v, ir.Load) and v in taps):
            return v
        _, a, b = taps[v]
        flat = stride * q + a * P + b
        return ir.Load(v.dtype, v.buffer, tuple(v.index[:-2]) + (FloorDiv(flat, P), ModularIndexing(flat, 1, P)))

    plane = ir.Node(f"{node.name}_plane", "pointwise", buf, body=ir.map_values(node.body, along_rows),
                    source=node.source)
    lead = tuple(ir.ivar(d) for d in range(r - 2))
    copy = ir.Node(node.name, "pointwise", node.out, body=ir.Load(buf.dtype, name, lead + (y * P + x,)),
                   source=node.source)
    return plane, copy


def _tap_offsets(index: tuple, y, x) -> tuple[int, int, int] | None:
    """(s, a, b) when ``index`` reads (…, s*y + a, s*x + b) with the leading positions free of y and x, else
    None."""
    if len(index) < 2:
        return None
    *lead, ey, ex = (sympy.sympify(e) for e in index)
    if any({y, x} & e.free_symbols for e in lead):
        return None
    s = sympy.expand(ey).coeff(y)
    a, b = sympy.expand(ey - s * y), sympy.expand(ex - s * x)
    if not (s.is_Integer and int(s) >= 1 and a.is_Integer and b.is_Integer):
        return None
    return int(s), int(a), int(b)


def _symbols(v) -> set:
    if isinstance(v, ir.IndexValue):
        return sympy.sympify(v.expr).free_symbols
    if isinstance(v, (ir.Load, ir.LoadIndirect)):
        return set().union(*(sympy.sympify(e).free_symbols for e in v.index)) if v.index else set()
    return set()
