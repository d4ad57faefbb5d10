"""Split-KV (flash-decoding) for the GPU backend: an attention kernel runs one program per block of query rows
and (batch, head), each walking all keys in turn. A decode step has one query row a head, so GPT-2 small at
batch 1 runs 12 programs on a GPU of 132 SMs, each reading a 1088-key cache alone (about 24 us a layer on an
H200 where its bytes need about 1). Such a kernel gets, for shapes with at most SPLIT_M query rows, two kernels
in its place:

    P: attention over slice s of the keys -> acc[s, b, m, :] (unnormalised), stats[s, b, m] = (max, sum)
    R: loops  out[b, m, :] = epilogue(sum_s w_s * acc[s, b, m, :] / sum_s w_s * sum_s),  w_s = exp(max_s - max)

P is the attention kernel itself with a third grid axis over the slices (cuda/attention.py renders its
stores); R is ordinary loop IR, a fixed-order sum (the result does not depend on scheduling), with the original
epilogue (the rounding cast). A slice whose keys are all masked has max -inf and sum 0 and weighs 0; a row whose
keys are all masked gives NaN, as the unsplit kernel and the unfused softmax do. Both carry the 0/1 factor
``[M <= SPLIT_M]`` in their grids and the original keeps ``[M > SPLIT_M]``, as split_k.py does, so exactly one
path runs per shape. Only a static key count splits (a static KV cache, where it pays): a dynamic one is the
query's own length in self-attention, and few query rows then mean few keys.

Grouped-query attention reads one K/V head for several query heads (the K and V views index the batch by
``i0 // r``). P then takes a group's rows together (``KvSplit.group``): a decode step of a Llama with 4 query
heads a KV head fills 4 rows of a program's 16 instead of 1, and reads each block of keys and values once per
group instead of once per query head. With that many fewer programs a head's keys split that much finer (down
to one 64-key block a slice), so the programs stay as many and each walks fewer blocks.
"""

from __future__ import annotations

import dataclasses

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.bounds import symbol_bounds, upper_bound
from tcexport.exporter.ir.kernels import Kernel, KvSplit
from tcexport.exporter.schedule.fuse import new_kernel, simplify_in_ranges

SPLIT_M = 16          # query rows a head up to which the keys split: a decode step, a few speculative tokens
KEYS_PER_SLICE = 128  # a slice covers at least this many keys (two of the kernel's 64-key blocks)...
MIN_KEYS_PER_SLICE = 64  # ...or one block, when a program takes a group of heads (see the module's docstring)
MAX_SLICES = 16
MAX_GROUP = 8         # query heads a program takes together at most


def slices(keys, group: int = 1) -> int:
    """How many slices a static key count splits into (1: none), for programs that each take ``group`` heads."""
    keys = sympy.sympify(keys)
    if not keys.is_Integer:
        return 1
    n = int(keys)
    return max(1, min(MAX_SLICES, n // KEYS_PER_SLICE * group, n // MIN_KEYS_PER_SLICE))


def kv_group(k: Kernel) -> int:
    """The largest r (a power of two up to MAX_GROUP) such that batch entries r*g .. r*g + r - 1 of an attention
    kernel read the same keys and values: the K and V views' indices do not depend on i0 % r (grouped-query
    attention's repeated KV heads, however the model repeats them), and r divides the batch."""
    g1, g2 = k.stages[0].node.gemm, k.stages[-1].node.gemm
    batch = sympy.sympify(g1.batch)
    r = MAX_GROUP
    while r > 1:
        if sympy.Mod(batch, r) == 0 and all(_batch_group_invariant(op, batch, r) for op in (g1.b, g2.b)):
            return r
        r //= 2
    return 1


def _batch_group_invariant(op: ir.GemmOperand, batch, r: int) -> bool:
    if op.index is None:
        return sympy.sympify(op.batch_stride) == 0
    g = sympy.Symbol("kv_g", integer=True, nonnegative=True)
    j = sympy.Symbol("kv_j", integer=True, nonnegative=True)
    ranges = {g: batch / r, j: sympy.Integer(r)}
    at = {ir.ivar(0): r * g + j}
    return all(j not in simplify_in_ranges(sympy.sympify(e).xreplace(at), ranges).free_symbols for e in op.index)


def split_kv(prog: ir.Program, kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` with every eligible attention kernel followed by its split pair, or replaced by it when no
    shape has more than SPLIT_M query rows (a new list; ``prog`` gains the partial buffers)."""
    bounds = symbol_bounds(prog)
    out = []
    for k in kernels:
        split = _split(prog, k, bounds)
        out += [k] if split is None else split
    return out


def _split(prog: ir.Program, k: Kernel, bounds: dict) -> list[Kernel] | None:
    if k.kind != "attention" or k.when is not None or k.kv_split is not None:
        return None
    g1, pv = k.stages[0].node.gemm, k.stages[-1].node
    group = kv_group(k)
    s = slices(g1.n, group)
    m_max = upper_bound(g1.m, bounds)
    if s == 1 or sympy.sympify(g1.m).is_Integer and int(g1.m) > SPLIT_M:
        return None
    rows = sympy.Integer(SPLIT_M if m_max is None else min(m_max, SPLIT_M))
    dv = pv.gemm.n
    acc = ir.Buffer(f"{pv.out.name}_kv_acc", "float32", (sympy.Integer(s), g1.batch, rows, dv), "temp")
    stats = ir.Buffer(f"{pv.out.name}_kv_stats", "float32", (sympy.Integer(s), g1.batch, rows, sympy.Integer(2)),
                      "temp")
    prog.buffers[acc.name] = acc
    prog.buffers[stats.name] = stats
    p = dataclasses.replace(k, name=f"{k.name}_split", kv_split=KvSplit(s, acc.name, stats.name, group))
    r = new_kernel(ir.Node(f"{pv.name}_combine", "pointwise", pv.out, body=_combined(pv, g1.m, acc, stats, s),
                           source=pv.source), 0)
    r.name = f"{k.name}_combine"
    if m_max is not None and m_max <= SPLIT_M:
        return [p, r]
    p.when = r.when = sympy.Min(1, sympy.Max(0, SPLIT_M + 1 - g1.m))
    return [dataclasses.replace(k, when=sympy.Min(1, sympy.Max(0, g1.m - SPLIT_M))), p, r]


def _combined(pv: ir.Node, m, acc: ir.Buffer, stats: ir.Buffer, s: int) -> ir.Value:
    """The PV GEMM's epilogue (or its bare store) with its result read as the slices' weighted merge. The
    attention kernel stores element (b, row, col) at b * M * DV + row * DV + col of its output."""
    out, dv = pv.out, pv.gemm.n
    idx = tuple(ir.ivar(d) for d in range(len(out.shape)))
    ranges = dict(zip(idx, out.shape))
    flat = out.flat_index(idx)
    b, row, col = (simplify_in_ranges(e, ranges) for e in
                   (FloorDiv(flat, m * dv), ModularIndexing(flat, dv, m), ModularIndexing(flat, 1, dv)))
    f32 = "float32"

    def op(name, *args):
        return ir.Op(f32, name, args)

    maxes = [ir.Load(f32, stats.name, (sympy.Integer(j), b, row, sympy.Integer(0))) for j in range(s)]
    sums = [ir.Load(f32, stats.name, (sympy.Integer(j), b, row, sympy.Integer(1))) for j in range(s)]
    parts = [ir.Load(f32, acc.name, (sympy.Integer(j), b, row, col)) for j in range(s)]
    top = maxes[0]
    for x in maxes[1:]:
        top = op("maximum", top, x)
    weights = [op("exp", op("sub", x, top)) for x in maxes]
    num = den = None
    for w, part, total in zip(weights, parts, sums):
        num = op("mul", w, part) if num is None else op("add", num, op("mul", w, part))
        den = op("mul", w, total) if den is None else op("add", den, op("mul", w, total))
    merged = op("div", num, den)
    if pv.body is None:
        return merged if out.dtype == f32 else ir.Op(out.dtype, "cast", (merged,))
    return ir.map_values(pv.body, lambda x: merged if isinstance(x, ir.Load) and x.buffer == out.name else x)
