"""Split-K for the GPU backend: a GEMM with few rows and a long K (a transformer's MLP down-projection at batch 1:
128 rows, K = 3072) has too few output tiles to fill the GPU, and each tile walks all of K alone. Such a GEMM
gets, for a band of row counts, two kernels in place of its own:

    P: gemm   partial[s, m, n] = A[m, s*K/S : (s+1)*K/S] @ B[s*K/S : (s+1)*K/S, n]   (float32, S slices)
    R: loops  out[...] = epilogue(partial[0, m, n] + ... + partial[S-1, m, n])

P is an ordinary batched GEMM over strided views (the slice is the batch), so the template and its tiles are
the usual ones; R sums the slices in a fixed order (the result does not depend on scheduling) and applies the
original epilogue (bias, residual, the rounding cast). The bands (small_m.py) split differently: up to FEW_M rows
(a decode step) by ``few_slices``, so that narrow tiles times slices reach about one program per SM; up to
SMALL_M by ``slices``; above that not at all. Every kernel of a band carries its 0/1 factor ``[lo < M <= hi]`` in
its grid (SPEC §6a: a launch with a 0 in its grid is skipped) and the band in ``Kernel.rows`` (its tiles), so
exactly one path runs per shape; a band that does not split runs the GEMM itself, restricted to the band. A
partial buffer holds at most its band's rows. The CPU keeps the one GEMM.
"""

from __future__ import annotations

import dataclasses

import sympy

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.bounds import lower_bound, symbol_bounds, upper_bound
from tcexport.exporter.ir.kernels import Kernel
from tcexport.exporter.schedule.fuse import new_kernel
from tcexport.exporter.schedule.small_m import FEW_M, SMALL_M

MIN_K = 1024        # K from which splitting pays: at least 4 slices of 256
SLICE_K = 256       # a slice covers at least this much of K (2 steps of the template's 128-wide K blocks)
MAX_SLICES = 8
SMALL_COLUMNS = 8192  # up to SMALL_M rows, N x slices of at least this: 128 programs of 64 columns a 64-row block

FEW_COLUMNS = 2048  # a few rows' GEMM wants N x slices of at least this: 128 programs of 16 columns (132 SMs)
FEW_SLICE_K = 512   # ... with slices of at least 512 (4 K-steps): shorter ones lose what they gain to R's launch
FEW_LONG_K = 2048   # ... and of at most 2048 where K allows, however many columns: a longer walk is serial
FEW_STEP_K = 128    # a slice is whole K-steps of the few rows' tiles (cuda/tiles.FEW_TILE's BK)


def slices(n, k) -> int:
    """How many slices a GEMM's static K splits into (1: none) for up to SMALL_M rows: doubled while the columns
    times the slices fall short of SMALL_COLUMNS, up to MAX_SLICES, as long as each slice stays a multiple of
    SLICE_K. A GEMM whose columns fill the GPU by themselves does not split: the partial sums' float32 traffic
    then costs more than the programs gain (H200, a ~1B Llama's MLP at 128 rows, N 8192, K 2048, in 8 slices:
    54 us, about a third of its weight bandwidth). A symbolic N counts as wide."""
    if not sympy.sympify(k).is_Integer or int(k) < MIN_K or not sympy.sympify(n).is_Integer:
        return 1
    s = 1
    while s < MAX_SLICES and int(k) % (2 * s * SLICE_K) == 0 and int(n) * s < SMALL_COLUMNS:
        s *= 2
    return s


def few_slices(n, k) -> int:
    """How many slices a GEMM's static K splits into for up to FEW_M rows: doubled while the columns times the
    slices fall short of FEW_COLUMNS or a slice is longer than FEW_LONG_K, as long as a slice stays whole K-steps
    of at least FEW_SLICE_K. Chosen from the best of 80 configs of each of GPT-2 small's and a ~1B Llama's
    projections (bench.probes.decode_gemm, H100): 4 for GPT-2's down-projection (N 768, K 3072), Llama's K/V
    (512, 2048) and its down-projection (2048, 8192); 1 for the others, whose columns alone fill the GPU or whose
    K is short. A symbolic N counts as wide."""
    if not sympy.sympify(k).is_Integer:
        return 1
    k = int(k)
    wide = not sympy.sympify(n).is_Integer
    s = 1
    while (s < MAX_SLICES and k % (2 * s * FEW_STEP_K) == 0 and k // (2 * s) >= FEW_SLICE_K
           and (not wide and int(n) * s < FEW_COLUMNS or k // s > FEW_LONG_K)):
        s *= 2
    return s


def split_k(prog: ir.Program, kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` with every eligible GEMM kernel replaced by one path per band of rows (a new list; ``prog``
    gains the partial buffers)."""
    bounds = symbol_bounds(prog)
    out = []
    for k in kernels:
        split = _split(prog, k, bounds)
        out += [k] if split is None else split
    return out


def _bands(m_min: int, m_max: int, n, k) -> list[tuple[int, int | None, int]]:
    """[(rows above, rows up to, slices)] over m_min..m_max, neighbours with equal slices merged; the first band's
    lower end and the last one's upper end are 0 and None where the rows cannot pass them."""
    bands = []
    for lo, hi, s in ((0, FEW_M, few_slices(n, k)), (FEW_M, SMALL_M, slices(n, k)), (SMALL_M, None, 1)):
        if m_min <= (hi if hi is not None else m_max) and m_max > lo:
            if bands and bands[-1][2] == s:
                bands[-1] = (bands[-1][0], hi, s)
            else:
                bands.append((lo, hi, s))
    (lo, hi, s), last = bands[0], bands[-1]
    bands[0] = (0, hi, s)
    bands[-1] = (bands[-1][0], None if last[1] is None or last[1] >= m_max else last[1], last[2])
    return bands


def _split(prog: ir.Program, k: Kernel, bounds: dict) -> list[Kernel] | None:
    """The kernels of ``k``'s bands, or None when ``k`` stays as it is."""
    if k.kind != "gemm" or k.when is not None:
        return None
    node = k.stages[0].node
    g = node.gemm
    if g.batch != 1 or g.acc_dtype != "float32" or g.a.index is not None or g.b.index is not None:
        return None
    m_max = upper_bound(g.m, bounds)
    if m_max is None or m_max < 1:  # no rows (an empty batch): nothing to split
        return None
    out = node.out
    if not ir.same_size(out.shape[-1], g.n) or not ir.same_size(ir.product(out.shape[:-1]), g.m):
        return None
    own = tuple(ir.ivar(d) for d in range(len(out.shape)))
    if node.body is not None and any(tuple(x.index) != own for x in ir.loads(node.body) if x.buffer == out.name):
        return None
    bands = _bands(lower_bound(g.m, prog), m_max, g.n, g.k)
    if all(s == 1 for _, _, s in bands):
        return None
    kernels = []
    for lo, hi, s in bands:
        when = _band(g.m, lo, hi)
        tag = "" if hi is None or hi == SMALL_M else f"_m{hi}"
        if s == 1:
            kernels.append(dataclasses.replace(k, name=k.name + tag, when=when, rows=(lo, hi)))
            continue
        rows = g.m if hi is None or m_max <= hi else sympy.Min(g.m, hi)
        partial = ir.Buffer(f"{out.name}_slices{tag}", "float32", (sympy.Integer(s), rows, g.n), "temp")
        prog.buffers[partial.name] = partial
        width = sympy.Integer(int(g.k) // s)
        a = dataclasses.replace(g.a, batch_stride=width * g.a.col_stride)
        b = dataclasses.replace(g.b, batch_stride=width * g.b.row_stride)
        p_node = ir.Node(f"{node.name}_slices{tag}", "gemm", partial,
                         gemm=ir.Gemm(a, b, sympy.Integer(s), g.m, g.n, width), source=node.source)
        r_node = ir.Node(f"{node.name}_sum{tag}", "pointwise", out, body=_summed(node, partial, s),
                         source=node.source)
        p, r = new_kernel(p_node, 0), new_kernel(r_node, 0)
        p.name, r.name = f"{k.name}_slices{tag}", f"{k.name}_sum{tag}"
        p.rows = (lo, hi)
        p.when = r.when = when
        kernels += [p, r]
    return kernels


def _band(m, lo: int, hi: int | None):
    """1 when lo < m <= hi (None: no upper end), else 0 (m >= 1); None when every m is in it."""
    if lo == 0 and hi is None:
        return None
    above = sympy.Integer(1) if lo == 0 else sympy.Min(1, sympy.Max(0, m - lo))
    return above if hi is None else above * sympy.Min(1, sympy.Max(0, hi + 1 - m))


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
