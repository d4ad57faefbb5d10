"""Split-K for the GPU backend: a GEMM with few rows and a long K (a transformer's MLP down-projection at batch 1:
128 rows, K = 3072) has too few output tiles to fill the GPU, and each tile walks all of K alone. Such a GEMM
gets, for shapes with at most SMALL_M rows, two kernels in place of its small-M variant:

    P: gemm   partial[s, m, n] = A[m, s*K/S : (s+1)*K/S] @ B[s*K/S : (s+1)*K/S, n]   (float32, S slices)
    R: loops  out[...] = epilogue(partial[0, m, n] + ... + partial[S-1, m, n])

P is an ordinary batched GEMM over strided views (the slice is the batch), so the template and its tiles are
the usual ones; R sums the slices in a fixed order (the result does not depend on scheduling) and applies the
original epilogue (bias, residual, the rounding cast). Both carry the 0/1 factor ``[M <= SMALL_M]`` in their
grids and the original GEMM keeps ``[M > SMALL_M]`` (SPEC §6a: a launch with a 0 in its grid is skipped), so
exactly one path runs per shape. The partial buffer holds at most SMALL_M rows. The CPU keeps the one GEMM.
"""

from __future__ import annotations

import dataclasses

import sympy

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.bounds import symbol_bounds, upper_bound
from tcexport.exporter.ir.kernels import Kernel
from tcexport.exporter.schedule.fuse import new_kernel
from tcexport.exporter.schedule.small_m import SMALL_M

MIN_K = 1024        # K from which splitting pays: at least 4 slices of 256
SLICE_K = 256       # a slice covers at least this much of K (2 steps of the template's 128-wide K blocks)
MAX_SLICES = 8


def slices(k) -> int:
    """How many slices a GEMM's static K splits into (1: none): the largest power of two up to MAX_SLICES that
    leaves each slice a multiple of SLICE_K."""
    if not sympy.sympify(k).is_Integer or int(k) < MIN_K:
        return 1
    s = MAX_SLICES
    while s > 1 and (int(k) % (s * SLICE_K)):
        s //= 2
    return s


def split_k(prog: ir.Program, kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` with every eligible GEMM kernel followed by its split-K pair, or replaced by it when no shape
    has more than SMALL_M rows (a new list; ``prog`` gains the partial buffers)."""
    bounds = symbol_bounds(prog)
    out = []
    for k in kernels:
        split = _split(prog, k, bounds)
        out += [k] if split is None else split
    return out


def _split(prog: ir.Program, k: Kernel, bounds: dict) -> list[Kernel] | None:
    """[the GEMM for the shapes with more rows (if any), P, R], or None when ``k`` stays as it is."""
    if k.kind != "gemm" or k.when is not None:
        return None
    node = k.stages[0].node
    g = node.gemm
    s = slices(g.k)
    if s == 1 or g.batch != 1 or g.acc_dtype != "float32" or g.a.index is not None or g.b.index is not None:
        return None
    m_max = upper_bound(g.m, bounds)
    if sympy.sympify(g.m).is_Integer and int(g.m) > SMALL_M or m_max is None:
        return None
    out = node.out
    if not ir.same_size(out.shape[-1], g.n) or not ir.same_size(ir.product(out.shape[:-1]), g.m):
        return None
    own = tuple(ir.ivar(d) for d in range(len(out.shape)))
    if node.body is not None and any(tuple(x.index) != own for x in ir.loads(node.body) if x.buffer == out.name):
        return None
    rows = g.m if m_max <= SMALL_M else sympy.Min(g.m, SMALL_M)
    partial = ir.Buffer(f"{out.name}_slices", "float32", (sympy.Integer(s), rows, g.n), "temp")
    prog.buffers[partial.name] = partial
    width = sympy.Integer(int(g.k) // s)
    a = dataclasses.replace(g.a, batch_stride=width * g.a.col_stride)
    b = dataclasses.replace(g.b, batch_stride=width * g.b.row_stride)
    p_node = ir.Node(f"{node.name}_slices", "gemm", partial, gemm=ir.Gemm(a, b, sympy.Integer(s), g.m, g.n, width),
                     source=node.source)
    r_node = ir.Node(f"{node.name}_sum", "pointwise", out, body=_summed(node, partial, s), source=node.source)
    p = new_kernel(p_node, 0)
    r = new_kernel(r_node, 0)
    p.name, r.name = f"{k.name}_slices", f"{k.name}_sum"
    p.small_m = True
    if m_max <= SMALL_M:
        return [p, r]
    p.when = r.when = sympy.Min(1, sympy.Max(0, SMALL_M + 1 - g.m))
    return [dataclasses.replace(k, when=sympy.Min(1, sympy.Max(0, g.m - SMALL_M))), p, r]


def _summed(node: ir.Node, partial: ir.Buffer, s: int) -> ir.Value:
    """The GEMM's epilogue (or its bare store) with its accumulator read as the sum of the slices."""
    out = node.out
    idx = tuple(ir.ivar(d) for d in range(len(out.shape)))
    row = sympy.Integer(0)
    for d in range(len(out.shape) - 1):
        row = row * out.shape[d] + idx[d]
    total = None
    for j in range(s):
        load = ir.Load("float32", partial.name, (sympy.Integer(j), row, idx[-1]))
        total = load if total is None else ir.Op("float32", "add", (total, load))
    if node.body is None:
        return total if out.dtype == "float32" else ir.Op(out.dtype, "cast", (total,))

    def fn(x):
        return total if isinstance(x, ir.Load) and x.buffer == out.name else x
    return ir.map_values(node.body, fn)
