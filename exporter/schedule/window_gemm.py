"""Convolutions without im2col on the CPU. lower/conv.py writes a convolution as im2col + GEMM: cols[n, (ci, taps),
o...] holds x at every output's window, taps times the input's size, written by one kernel and read back by the
GEMM (ResNet-50 at batch 8: 58 MB for each 3x3 layer at 56x56). Here the GEMM reads its taps from the input
instead, through one zero-padded copy of x laid out by stride phase (s: the stride, p: the padding),

    xp[n, ci, a, b, y, z] = x[n, ci, s*y + a - p, s*z + b - p]    (0 outside x; a, b < s)

in which tap (ki, kj) of output (oh, ow) is xp[n, ci, (ki*d) % s, (kj*d) % s, oh + (ki*d) // s, ow + (kj*d) // s]
(d: the dilation). For one channel and tap, a row of B is then a run of xp that starts at an offset of the row's
own: ``ir.GemmOperand.rows``, which the C++ GEMM reads through that table. The columns walk the output's rows at
xp's row pitch Q (>= the output's width W), so each output row carries Q - W columns that are computed and dropped:
the GEMM writes a [n, Cout, H, Q] product and the epilogue (bias, activation, residual), a kernel of its own then,
reads it at that pitch and writes the output at its own. A 1-D convolution (Whisper's) needs no such columns.

Taken where it pays: the copy is smaller than cols (a 1x1 window, or a patchify whose stride equals its window,
keeps cols: it is no larger than x), and the dropped columns cost less than cols' traffic. Per output element
the dropped columns add (Q - W) / W x 2 Cout x K flops and cols costs 2 x 4 K bytes (written, read), so the copy
wins while (Q - W) x Cout <= 4 x (flops / byte) x W; the machine's flops per byte of bandwidth (float32 GEMM
peak over copy bandwidth, bench/results: 180 GFLOP/s over 37 GB/s on 2 cores) is about 5, hence WASTE = 20:
ResNet-50's 3x3 layers at 56 and 28 wide (Cout 64, 128) and its 7x7 stem qualify, those at 14 and 7 wide
(Cout 256, 512) do not. The GPU keeps im2col (the Triton template reads cols once, and a copy costs a launch).
"""

from __future__ import annotations

import dataclasses
import math

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import Kernel
from tcexport.exporter.lower.values import all_of
from tcexport.exporter.schedule.fuse import new_kernel
from tcexport.exporter.schedule.pad_windows import single_read, tap

WASTE = 20  # the dropped columns times Cout allowed per output column (see above)


@dataclasses.dataclass(frozen=True)
class Window:
    """An im2col buffer's geometry: cols[n, ci, k..., o...] = f(x[n, ci, o*stride - pad + k*dilation]) (0 in
    the padding), one entry per spatial dim."""

    source: str          # x's buffer
    template: ir.Value   # f(x) with the read at (i0, i1, i2, ...): x's own element
    kernel: tuple
    out: tuple
    size: tuple          # x's spatial sizes
    stride: tuple
    pad: tuple
    dilation: tuple

    def reach(self, d: int) -> int:
        """How far past an output's own phase row its window reaches in dim d, in rows of xp."""
        return (self.kernel[d] - 1) * self.dilation[d] // self.stride[d]


def window_gemm(prog: ir.Program, kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` with each eligible im2col + GEMM pair replaced by a phase copy, the GEMM over it and, where
    the columns are widened, the epilogue (a new list; ``prog`` gains the new buffers)."""
    producers = {k.stages[0].node.out.name: k for k in kernels if k.kind == "loops" and len(k.stages) == 1}
    readers: dict[str, int] = {}
    for k in kernels:
        for name in {b for s in k.stages for b in s.node.inputs()}:
            readers[name] = readers.get(name, 0) + 1
    copies, rewritten = {}, {}
    for k in kernels:
        if k.kind != "gemm" or len(k.stages) != 1:
            continue
        b = k.stages[0].node.gemm.b.buffer
        if b not in producers or readers.get(b) != 1 or prog.buffers[b].kind != "temp":
            continue
        found = _rewrite(prog, k, producers[b])
        if found is not None:
            copies[id(producers[b])], rewritten[id(k)] = found[0], found[1]
    out = []
    for k in kernels:
        out += [copies[id(k)]] if id(k) in copies else rewritten.get(id(k), [k])
    return out


def window_of(prog: ir.Program, node: ir.Node) -> Window | None:
    """``node``'s geometry when it is lower/conv.py's im2col of one buffer over 1 or 2 spatial dims with a batch
    dim, all sizes but the batch static; else None."""
    if node.kind != "pointwise" or node.body is None:
        return None
    t = tap(prog, node.body)
    if t is not None:
        source, raw, template = t.buffer, t.raw, t.template
    else:  # no padding: a plain read, no select
        read = single_read(prog, node.body)
        if read is None:
            return None
        source, raw, template = read
    shape, src = node.out.shape, prog.buffers[source].shape
    nsp = len(src) - 2
    if nsp not in (1, 2) or len(shape) != 2 + 2 * nsp or len(raw) != len(src):
        return None
    if not all(sympy.sympify(e).is_Integer for e in list(shape[1:]) + list(src[1:])) or \
            sympy.expand(shape[0] - src[0]) != 0 or int(shape[1]) != int(src[1]):
        return None
    if sympy.sympify(raw[0]) != ir.ivar(0) or sympy.sympify(raw[1]) != ir.ivar(1):
        return None
    stride, pad, dilation = [], [], []
    for d in range(nsp):
        e, k, o = sympy.expand(raw[2 + d]), ir.ivar(2 + d), ir.ivar(2 + nsp + d)
        s, dil = e.coeff(o), e.coeff(k)
        rest = sympy.expand(e - s * o - dil * k)
        if not (s.is_Integer and dil.is_Integer and rest.is_Integer and s > 0 and dil > 0 and rest <= 0):
            return None
        stride.append(int(s))
        dilation.append(int(dil))
        pad.append(-int(rest))
    return Window(source, template, tuple(int(k) for k in shape[2:2 + nsp]), tuple(int(o) for o in shape[2 + nsp:]),
                  tuple(int(x) for x in src[2:]), tuple(stride), tuple(pad), tuple(dilation))


def _rewrite(prog: ir.Program, k: Kernel, producer: Kernel) -> tuple[Kernel, list[Kernel]] | None:
    """(the phase copy replacing ``producer``, the kernels replacing GEMM kernel ``k``), or None."""
    node = k.stages[0].node
    g = node.gemm
    cols = producer.stages[0].node.out
    w = window_of(prog, producer.stages[0].node)
    if w is None or g.acc_dtype != "float32" or node.out.dtype != "float32" or cols.dtype != "float32":
        return None
    nsp, cin, taps, o = len(w.out), int(cols.shape[1]), math.prod(w.kernel), math.prod(w.out)
    b, n = g.b, cols.shape[0]
    same = lambda x, y: sympy.expand(sympy.sympify(x) - sympy.sympify(y)) == 0  # noqa: E731
    if not (b.index is None and b.rows is None and same(b.offset, 0) and same(b.col_stride, 1)
            and same(b.row_stride, o) and same(b.batch_stride, cin * taps * o) and same(g.k, cin * taps)
            and same(g.n, o) and same(g.batch, n) and sympy.sympify(g.m).is_Integer):
        return None
    out_shape = node.out.shape
    if len(out_shape) != 2 + nsp or not same(out_shape[0], n) or not same(out_shape[1], g.m) or \
            any(not same(a, c) for a, c in zip(out_shape[2:], w.out)):
        return None
    cout = int(g.m)
    q = [w.out[d] + w.reach(d) for d in range(nsp)]   # xp's rows per phase, per dim
    wide = nsp == 2 and q[-1] > w.out[-1]
    if wide and (q[-1] - w.out[-1]) * cout > WASTE * w.out[-1]:
        return None
    held = list(q)
    if nsp == 2:
        held[0] += 1  # a spare row: the dropped columns of the last row read past it
    phases = math.prod(w.stride)
    if phases * math.prod(held) >= taps * o:
        return None  # the copy would not be smaller than cols
    xp = ir.Buffer(f"{cols.name}_phases", cols.dtype, (n, cols.shape[1], *w.stride, *held), "temp")
    prog.buffers[xp.name] = xp
    copy = new_kernel(ir.Node(f"{producer.stages[0].node.name}_phases", "pointwise", xp, body=_phase_copy(w, nsp),
                              source=producer.stages[0].node.source), 0)
    copy.name = f"{producer.name}_phases"

    plane = math.prod(held)
    phase_pitch = [math.prod(w.stride[d + 1:]) * plane for d in range(nsp)]
    row_pitch = [math.prod(held[d + 1:]) for d in range(nsp)]
    offset = ir.ivar(0) * phases * plane
    for d in range(nsp):
        t = ir.ivar(1 + d) * w.dilation[d]
        s = w.stride[d]
        offset += t * row_pitch[d] if s == 1 else \
            ModularIndexing(t, 1, s) * phase_pitch[d] + FloorDiv(t, s) * row_pitch[d]
    columns = (math.prod(w.out[:-1]) * q[-1]) if wide else o
    operand = ir.GemmOperand(xp.name, sympy.Integer(0), sympy.Integer(cin * phases * plane), sympy.Integer(0),
                             sympy.Integer(1), rows=((cin, *w.kernel), offset))
    if not wide:
        gemm = dataclasses.replace(node, gemm=dataclasses.replace(g, b=operand))
        return copy, [dataclasses.replace(k, stages=[dataclasses.replace(k.stages[0], node=gemm)])]
    product = ir.Buffer(f"{node.out.name}_wide", "float32", (n, cout, *w.out[:-1], q[-1]), "temp")
    prog.buffers[product.name] = product
    gemm = new_kernel(ir.Node(f"{node.name}_wide", "gemm", product,
                              gemm=dataclasses.replace(g, b=operand, n=sympy.Integer(columns)), source=node.source), 0)
    gemm.name = k.name.removesuffix("_epilogue")  # its epilogue is the next kernel's
    own = tuple(ir.ivar(d) for d in range(len(out_shape)))
    read = ir.Load("float32", product.name, own)
    body = read if node.body is None else ir.map_values(
        node.body, lambda v: ir.Load(v.dtype, product.name, v.index) if isinstance(v, ir.Load) and v.buffer == node.out.name
        else v)
    epilogue = new_kernel(ir.Node(f"{node.name}_epilogue", "pointwise", node.out, body=body, source=node.source), 0)
    epilogue.name = f"{gemm.name}_epilogue"
    return copy, [gemm, epilogue]


def _phase_copy(w: Window, nsp: int) -> ir.Value:
    """xp[n, ci, a..., y...] = f(x[n, ci, s*y + a - p, ...]) inside x, 0 in the padding and past it."""
    conds, index = [], [ir.ivar(0), ir.ivar(1)]
    for d in range(nsp):
        pos = w.stride[d] * ir.ivar(2 + nsp + d) + ir.ivar(2 + d) - w.pad[d]
        conds.append(ir.Op("bool", "ge", (ir.IndexValue("int64", pos), ir.Const("int64", 0))))
        conds.append(ir.Op("bool", "lt", (ir.IndexValue("int64", pos), ir.IndexValue("int64", sympy.Integer(w.size[d])))))
        index.append(sympy.Min(sympy.Max(pos, 0), w.size[d] - 1))
    own = {ir.ivar(d): e for d, e in enumerate(index)}
    val = ir.map_values(w.template, lambda v: ir.Load(v.dtype, v.buffer, tuple(sympy.sympify(e).xreplace(own)
                                                                                for e in v.index))
                        if isinstance(v, ir.Load) else v)
    return ir.Op(val.dtype, "where", (all_of(conds), val, ir.Const(val.dtype, 0)))
