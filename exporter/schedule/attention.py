"""Attention for the GPU backend: the three kernels of a softmax attention (scores GEMM, row softmax, probabilities
times values) become one flash-attention kernel, which never writes the scores or the probabilities.

The match is semantic, on kernels fusion already built from the one IR, so it catches SDPA, its causal and masked
forms, and hand-written ``softmax(q @ k.T * scale + mask) @ v`` alike:

    A: gemm   S[..., m, n] = Q @ K^T, then any pointwise epilogue of S (scale, mask add)
    B: loops  mx = max_n S;  sm = sum_n exp(S - mx);  P = exp(S - mx) / sm
    C: gemm   O = P @ V, then any pointwise epilogue (the rounding cast)

S and P must be temporaries with no other reader, and the head dims must be static (they size the tiles). The CPU backend
fuses only where that pays (schedule/cpu.py): its GEMMs are faster than the fused kernel's loops on small scores.
"""

from __future__ import annotations

import sympy

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import Kernel

MAX_HEAD_DIM = 256  # q/k/v tiles of up to this many columns stay in registers


def attention_triples(prog: ir.Program, kernels: list[Kernel]) -> list[tuple[Kernel, Kernel, Kernel, Kernel]]:
    """Every matching (A, B, C) triple of ``kernels`` with the one ``attention`` kernel that computes it."""
    consumers = prog.consumers()
    where = {s.node.out.name: k for k in kernels for s in k.stages}
    triples = []
    for a in kernels:
        match = _match(prog, a, consumers, where)
        if match is None:
            continue
        b, c = match
        merged = Kernel(a.name.split("_")[0] + "_attention", "attention", c.outer, (),
                        a.stages + b.stages + c.stages)
        merged.local = {a.stages[0].node.out.name} | {s.node.out.name for s in b.stages}
        triples.append((a, b, c, merged))
    return triples


def fuse_attention(prog: ir.Program, kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` with every matching (A, B, C) triple replaced by one ``attention`` kernel at C's position;
    the input list is left as it is."""
    triples = attention_triples(prog, kernels)
    fused = {id(c): merged for _, _, c, merged in triples}
    gone = {id(x) for a, b, _, _ in triples for x in (a, b)}
    return [fused.get(id(k), k) for k in kernels if id(k) not in gone]


def _match(prog, a: Kernel, consumers: dict, where: dict) -> tuple[Kernel, Kernel] | None:
    if a.kind != "gemm":
        return None
    qk = a.stages[0].node
    g1 = qk.gemm
    s = qk.out
    if s.kind != "temp" or s.dtype != "float32" or g1.acc_dtype != "float32" or len(s.shape) < 2:
        return None
    if not (ir.same_size(s.shape[-1], g1.n) and ir.same_size(s.shape[-2], g1.m)):
        return None
    readers = consumers.get(s.name, [])
    b = where.get(readers[0].out.name) if readers else None
    if b is None or b.kind != "loops" or len(b.stages) != 3 or not {id(n) for n in readers} <= {id(n) for n in b.nodes}:
        return None
    p = _softmax(b, s)
    if p is None or p.kind != "temp":  # probabilities someone keeps (a training forward's saved activation)
        return None
    pv_readers = consumers.get(p.name, [])
    if len(pv_readers) != 1 or pv_readers[0].kind != "gemm":
        return None
    c = where[pv_readers[0].out.name]
    g2 = c.stages[0].node.gemm
    rows, cols = s.shape[-2], s.shape[-1]
    reads_p = (g2.a.buffer == p.name and g2.a.index is None and g2.b.buffer != p.name
               and all(ir.same_size(x, y) for x, y in ((g2.a.offset, 0), (g2.a.batch_stride, rows * cols),
                                                       (g2.a.row_stride, cols), (g2.a.col_stride, 1))))
    if not reads_p or not all(ir.same_size(x, y) for x, y in ((g2.m, g1.m), (g2.k, g1.n), (g2.batch, g1.batch))):
        return None
    if g2.acc_dtype != "float32" or not all(_small_static(d) for d in (g1.k, g2.n)):
        return None
    return b, c


def _small_static(e) -> bool:
    e = sympy.sympify(e)
    return e.is_Integer and 0 < int(e) <= MAX_HEAD_DIM


def scores(k: Kernel) -> tuple[ir.Value, ir.Load]:
    """For an attention kernel: the softmax's input as a value over P's index variables (the scores, with any
    pointwise step the softmax applied to them, such as a causal mask fused there), and the Load of S in it,
    which the kernel binds to the scores GEMM's result."""
    s = k.stages[0].node.out
    mx_node, p_node = k.stages[1].node, k.stages[3].node
    rank = len(p_node.out.shape)
    value = ir.subs_index(mx_node.body, {ir.rvar(0): ir.ivar(rank - 1)})
    (load,) = {x for x in ir.loads(value) if x.buffer == s.name}
    return value, load


def _softmax(b: Kernel, s: ir.Buffer) -> ir.Buffer | None:
    """P when ``b`` is exactly the row softmax, over the last dim, of a pointwise function of ``s`` that reads
    each element of ``s`` at P's own position (``s`` may drop P's size-1 dims), else None."""
    mx_node, sm_node, p_node = b.nodes
    if [st.level for st in b.stages] != ["reduce", "reduce", "inner"] or \
            not {mx_node.out.name, sm_node.out.name} <= b.local:
        return None
    if not (mx_node.reduce_op == "max" and sm_node.reduce_op == "sum" and p_node.kind == "pointwise"):
        return None
    shape = tuple(p_node.out.shape)
    rank = len(shape)
    if rank < 2 or p_node.out.dtype != "float32" or len(mx_node.reduce_ranges) != 1 or \
            not ir.same_size(mx_node.reduce_ranges[0], shape[-1]) or tuple(mx_node.out.shape) != shape[:-1] + (1,):
        return None
    if not (ir.same_size(ir.product(shape), s.numel()) and ir.same_size(shape[-1], s.shape[-1])
            and ir.same_size(shape[-2], s.shape[-2])):
        return None
    row = tuple(ir.ivar(d) for d in range(rank - 1))
    mx = ir.Load("float32", mx_node.out.name, row + (0,))
    sm = ir.Load("float32", sm_node.out.name, row + (0,))
    e_r = mx_node.body
    e_i = ir.subs_index(e_r, {ir.rvar(0): ir.ivar(rank - 1)})
    if e_r.dtype != "float32" or sm_node.body != ir.Op("float32", "exp", (ir.Op("float32", "sub", (e_r, mx)),)) \
            or p_node.body != ir.Op("float32", "div", (ir.Op("float32", "exp", (ir.Op("float32", "sub", (e_i, mx)),)), sm)):
        return None
    reads = ir.reads(e_i)
    if reads & {mx_node.out.name, sm_node.out.name, p_node.out.name} or any(
            isinstance(x, ir.LoadIndirect) and x.buffer == s.name for x in ir.walk(e_i)):
        return None
    s_loads = {x for x in ir.loads(e_i) if x.buffer == s.name}
    if len(s_loads) != 1:
        return None
    ones = {ir.ivar(d): 0 for d in range(rank) if shape[d] == 1}
    here = p_node.out.flat_index(tuple(ir.ivar(d) for d in range(rank)))
    at = s.flat_index(next(iter(s_loads)).index)
    if not ir.same_size(sympy.sympify(here).xreplace(ones), sympy.sympify(at).xreplace(ones)):
        return None
    return p_node.out


# ops through which a value stays x * a + b elementwise (a, b free of x), so that b = -inf makes it -inf for
# every finite x; "where" only with a condition free of x (it picks a branch independently of x); casts between
# float32 and bfloat16 (one exponent range: a finite value stays finite)
_AFFINE = {"add": (0, 1), "sub": (0, 1), "neg": (0,), "mul": (0, 1), "div": (0,), "where": (1, 2), "cast": (0,)}
_WIDE = ("float32", "bfloat16")


def _affine(v: ir.Value, leaf: ir.Value) -> bool:
    """Whether ``v`` is affine in ``leaf`` elementwise (``a * leaf + b``, ``a`` and ``b`` free of it)."""
    if v == leaf or not any(x == leaf for x in ir.walk(v)):
        return True
    if not isinstance(v, ir.Op) or v.op not in _AFFINE or v.dtype not in _WIDE or \
            v.op == "cast" and v.args[0].dtype not in _WIDE:
        return False
    carriers = [a for a in v.args if any(x == leaf for x in ir.walk(a))]
    allowed = [v.args[i] for i in _AFFINE[v.op]]
    if v.op == "mul" and len(carriers) > 1:  # a product of two terms in the leaf is not affine
        return False
    return all(any(c is a for a in allowed) for c in carriers) and all(_affine(c, leaf) for c in carriers)


def _may_be_minus_inf(v: ir.Value, leaf: ir.Value) -> bool:
    """Whether the part of ``v`` free of ``leaf`` can be -inf: it reads another buffer or holds -inf."""
    return any(isinstance(x, (ir.Load, ir.LoadIndirect)) and x != leaf or
               isinstance(x, ir.Const) and x.value == float("-inf") for x in ir.walk(v))


def skips_masked_keys(k: Kernel) -> bool:
    """Whether an attention kernel may skip a block of keys whose scores, computed with a zero product, are all
    -inf: true when the scores are affine in the product q·k (scale, mask add, ``where(keep, s, -inf)``), so
    such a block's scores are -inf for every q and k and its probabilities 0; and only when the part without
    the product can be -inf at all (a mask, a causal condition). A padded or causally masked block, and the
    empty part of a static KV cache, then cost one mask read instead of two tile loads and two dots."""
    qk = k.stages[0].node
    value, s_load = scores(k)
    here = ir.Load(qk.gemm.acc_dtype, qk.out.name, tuple(ir.ivar(d) for d in range(len(qk.ranges))))
    parts = [(value, s_load)] + ([(qk.body, here)] if qk.body is not None else [])
    return all(_affine(v, leaf) for v, leaf in parts) and any(_may_be_minus_inf(v, leaf) for v, leaf in parts)
