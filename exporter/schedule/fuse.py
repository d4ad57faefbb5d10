"""Fusion: loop IR nodes → kernels.

Generic passes, in order (after merging duplicate nodes and folding copies into the GEMM operands they feed):
  1. epilogues: a pointwise node that is the only reader of a GEMM's output, element for element, becomes the
     GEMM's epilogue (bias, activation, residual, the rounding cast of a 16-bit float product); chains follow.
  2. inlining: a pointwise node is substituted into its readers' bodies unless it must exist in memory (a graph
     output, a GEMM operand) or inlining would recompute it per broadcast element (which a small function of the
     indices alone is, outside GEMM epilogues).
  3. grouping: nodes that iterate the same rows join one loop kernel — reductions over the same inner range,
     per-row scalars, and elementwise work over the row — when every value they read from the kernel itself is
     the one computed in the same row. Softmax and layer norm become one kernel each this way.
"""

from __future__ import annotations

import functools
import itertools

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import Kernel, Stage, ovar, qvar, verify_kernels

EXPENSIVE_OPS = {"exp", "log", "erf", "tanh", "sigmoid", "pow", "sqrt", "rsqrt", "sin", "cos", "div",
                 "log1p", "expm1", "atan2", "exp2", "log2", "tan", "atan"}


# ---------------------------------------------------------------------------------------------------------
# pass 0: common nodes (decompositions often compute the same reduction twice, e.g. var_mean's mean)


def _key(n: ir.Node):
    if n.kind == "gemm" or n.out.kind == "output":
        return None
    vm = _var_map(n, len(n.ranges), "row")  # size-1 dims vanish, so [b, 1] and [b] compare equal
    return (n.kind, n.out.dtype, tuple(map(sympy.expand, ir.squeeze(n.ranges))), n.reduce_op,
            tuple(map(sympy.expand, n.reduce_ranges)), ir.subs_index(n.body, vm))


def _reindex(index: tuple, src: ir.Buffer, dst: ir.Buffer) -> tuple:
    """An index into ``src`` as the same element of ``dst``, two buffers equal up to size-1 dims."""
    live = [e for e, size in zip(index, src.shape) if size != 1]
    out = []
    for size in dst.shape:
        out.append(sympy.Integer(0) if size == 1 else live.pop(0))
    return tuple(out)


def merge_common_nodes(prog: ir.Program) -> None:
    seen: dict = {}
    for n in list(prog.nodes):
        key = _key(n)
        if key is None:
            continue
        first = seen.setdefault(key, n)
        if first is n:
            continue
        old, new = n.out, first.out
        same_shape = tuple(old.shape) == tuple(new.shape)
        if not same_shape and (_read_indirectly(prog, old.name) or _gemm_operand_of(prog, old.name)):
            continue
        for r in prog.nodes:
            if r.body is not None:
                r.body = ir.rename_buffer(r.body, old.name, new.name,
                                          None if same_shape else lambda index: _reindex(index, old, new))
            for operand in (r.gemm.a, r.gemm.b) if r.gemm is not None else ():
                if operand.buffer == old.name:
                    operand.buffer = new.name
        prog.nodes.remove(n)
        del prog.buffers[old.name]


# ---------------------------------------------------------------------------------------------------------
# pass 1: GEMM epilogues


def _gemm_operand_of(prog: ir.Program, buf: str) -> bool:
    return any(n.gemm is not None and buf in (n.gemm.a.buffer, n.gemm.b.buffer) for n in prog.nodes)


def _read_indirectly(prog: ir.Program, buf: str, nodes=None) -> bool:
    return any(ld.buffer == buf for n in (nodes if nodes is not None else prog.nodes) if n.body is not None
               for ld in ir.indirect_loads(n.body))


def _same_element_loads(p: ir.Node, buf: ir.Buffer) -> bool:
    """Every read of ``buf`` in p's body is the element at p's own storage position (same flat offset). The
    index variable of a size-1 dim is 0: a batch-1 model's residual add, [1, seq, d] over the GEMM's [seq, d],
    is element for element (read as ``i0*seq*d + ...`` it was not, so every residual add of a static batch-1
    LM stayed a separate read of the GEMM's output, and inlining made each layer re-add all earlier ones)."""
    ones = {ir.ivar(k): 0 for k, size in enumerate(p.ranges) if size == 1}
    here = sympy.sympify(p.out.flat_index(tuple(ir.ivar(k) for k in range(len(p.ranges))))).xreplace(ones)
    return all(sympy.expand(sympy.sympify(buf.flat_index(ld.index)).xreplace(ones) - here) == 0
               for ld in ir.loads(p.body) if ld.buffer == buf.name) \
        and not any(ld.buffer == buf.name for ld in ir.indirect_loads(p.body))


def absorb_epilogues(prog: ir.Program) -> None:
    changed = True
    while changed:
        changed = False
        consumers = prog.consumers()
        for g in [n for n in prog.nodes if n.kind == "gemm"]:
            readers = consumers.get(g.out.name, [])
            if g.out.kind == "output" or len(readers) != 1:
                continue
            p = readers[0]
            acc = g.gemm.acc_dtype
            if p.kind != "pointwise" or (p.out.dtype != g.out.dtype and g.out.dtype != acc) \
                    or not ir.same_size(ir.product(p.ranges), ir.product(g.ranges)) \
                    or not _same_element_loads(p, g.out) or p.out.name in (g.gemm.a.buffer, g.gemm.b.buffer):
                continue
            # p reads the GEMM's result element for element (possibly through a contiguous reshape), so the
            # GEMM can store straight into p's buffer; the epilogue iterates p's shape.
            ident = tuple(ir.ivar(k) for k in range(len(p.ranges)))
            here = ir.Load(acc, p.out.name, ident)  # the accumulated product (see ir.Gemm)
            result = here
            if g.body is not None:  # the earlier epilogue, moved into p's index space through p's own read
                at = next(ld.index for ld in ir.loads(p.body) if ld.buffer == g.out.name)
                moved = ir.subs_index(g.body, {ir.ivar(k): e for k, e in enumerate(at)})
                result = ir.map_values(moved, lambda v: here if isinstance(v, ir.Load) and v.buffer == g.out.name
                                       else v)
            body = ir.map_values(p.body, lambda v: result if isinstance(v, ir.Load) and v.buffer == g.out.name
                                 else v)
            g.body = None if body == here and p.out.dtype == acc else body
            del prog.buffers[g.out.name]
            g.out = p.out
            prog.nodes.remove(g)
            prog.nodes[prog.nodes.index(p)] = g
            changed = True
            break


def _grouped(coords: list, extents: list, shape: tuple) -> tuple | None:
    """When ``shape`` is ``extents`` with each extent split into consecutive dims (a contiguous reshape: [4b, s,
    16] of [b, 4, s, 16]), each dim's index as a div/mod of its coordinate; None when it is not."""
    index, d = [], 0
    for x, ext in zip(coords, extents):
        group, size = [], sympy.Integer(1)
        while d < len(shape) and not ir.same_size(size, ext):
            group.append(shape[d])
            size = sympy.expand(size * shape[d])
            d += 1
        while d < len(shape) and shape[d] == 1:  # trailing size-1 dims belong to any group
            group.append(shape[d])
            d += 1
        if not ir.same_size(size, ext):
            return None
        inner = sympy.Integer(1)
        parts = []
        for k in range(len(group) - 1, -1, -1):
            q = x if inner == 1 else FloorDiv(x, inner)
            parts.append(sympy.Integer(0) if group[k] == 1 else (q if k == 0 else ModularIndexing(x, inner, group[k])))
            inner = inner * group[k]
        index += parts[::-1]
    return tuple(index) if d == len(shape) else None


def _operand_index(op: ir.GemmOperand, buf: ir.Buffer, batched: bool, extents: list) -> tuple:
    """The index into ``buf`` of operand element (b, row, col) (ivars 0..2; (row, col) unbatched)."""
    if op.index is not None:
        return op.index
    b, r, c = ir.ivar(0), ir.ivar(1), ir.ivar(2)  # see ir.GemmOperand
    contiguous = [sympy.expand(s) for s in (op.offset, op.batch_stride, op.row_stride, op.col_stride)] == \
        [0, sympy.expand(extents[-2] * extents[-1]) if batched else 0, sympy.expand(extents[-1]), 1]
    if contiguous:
        grouped = _grouped([b, r, c] if batched else [r, c], extents, tuple(buf.shape))
        if grouped is not None:
            return grouped
    flat = sympy.expand(op.offset + b * op.batch_stride + r * op.row_stride + c * op.col_stride)
    index, strides = [], buf.strides()
    for d, (size, stride) in enumerate(zip(buf.shape, strides)):
        index.append(FloorDiv(flat, stride) if d == 0 else ModularIndexing(flat, stride, size))
    return tuple(index)


@functools.lru_cache(maxsize=1)
def _sizevars():
    from torch._inductor.sizevars import SizeVarAllocator
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return SizeVarAllocator(ShapeEnv())


def simplify_in_ranges(e, ranges: dict) -> sympy.Expr:
    """``e`` simplified knowing each variable v of ``ranges`` lies in [0, ranges[v]): a view of a view's
    div/mod chains collapse (``(d + 32*n) // 32 % seq`` is ``n`` when d < 32 and n < seq), which saves integer
    divisions in every GPU load of the operand. Inductor's range simplifier does the algebra."""
    e = sympy.sympify(e)
    if not e.has(FloorDiv, ModularIndexing):
        return e
    used = {v: r for v, r in ranges.items() if v in e.free_symbols}
    if not used:
        return e
    e = sympy.expand(_sizevars().simplify_with_ranges(e, used))
    return _divisions_in_ranges(e, used) if e.has(FloorDiv, ModularIndexing) else e


def _divisions_in_ranges(e, ranges: dict) -> sympy.Expr:
    """What inductor's simplifier left (torch 2.11's keeps ``(d + 16*n + 16*seq*b) // (16*seq)`` whole, 2.13's
    does not), by one rule: ``(c*Y + R) // (k*c)`` is ``Y // k`` when 0 <= R < c over the ranges (c may hold
    symbols; k a positive integer), and a ModularIndexing likewise; innermost first."""
    def floordiv(x, d):
        x, d = sympy.expand(x), sympy.sympify(d)
        terms = sympy.Add.make_args(x)
        if len(terms) > 6:
            return None
        for size in range(len(terms), 0, -1):
            for big in itertools.combinations(terms, size):
                # c: what the terms share apart from their index variables (16*seq of 16*seq*b)
                c = functools.reduce(sympy.gcd, (t.as_independent(*ranges, as_Add=False)[0] for t in big))
                k = sympy.simplify(d / c)
                rest = sympy.expand(x - sum(big))
                if not (k.is_Integer and k > 0) or not _within(rest, c, ranges):
                    continue
                y = sympy.expand(sum(big) / c)
                return y if k == 1 else FloorDiv(y, k)
        return None

    def visit(v):
        if not isinstance(v, sympy.Basic) or not v.args:
            return v
        v = v.func(*(visit(a) for a in v.args))
        if isinstance(v, FloorDiv):
            return floordiv(*v.args) or v
        if isinstance(v, ModularIndexing):
            x, d, m = v.args
            q = floordiv(x, d)
            if q is None:
                return v
            top = _top(q, ranges)
            return q if top is not None and _nonnegative(m - 1 - top) else ModularIndexing(q, 1, m)
        return v

    return sympy.expand(visit(e))


def _top(e, ranges: dict):
    """The greatest value of ``e`` over the ranges when it is linear with nonnegative coefficients, else None."""
    e = sympy.expand(e)
    if not e.is_polynomial(*ranges) or any(sympy.degree(e, v) > 1 for v in ranges if v in e.free_symbols):
        return None
    low = e.xreplace({v: 0 for v in ranges})
    if not _nonnegative(low):
        return None
    top = low
    for v in e.free_symbols & set(ranges):
        c = e.coeff(v)
        if c.free_symbols & set(ranges) or not _nonnegative(c):
            return None
        top += c * (ranges[v] - 1)
    return sympy.expand(top)


def _within(rest, c, ranges: dict) -> bool:
    """0 <= rest < c over the ranges (rest linear with nonnegative coefficients)."""
    top = _top(rest, ranges)
    return top is not None and _nonnegative(c - 1 - top)


def _nonnegative(e) -> bool:
    """True when ``e`` (a polynomial in positive shape symbols and index variables) is >= 0 for every value
    they take: every coefficient in the shifted symbols (s = 1 + s') is >= 0."""
    e = sympy.expand(sympy.sympify(e))
    if e.is_Number:
        return bool(e >= 0)
    syms = sorted(e.free_symbols, key=str)
    if any(not s.is_integer or not s.is_nonnegative for s in syms):
        return False
    shifted = sympy.expand(e.xreplace({s: s + 1 for s in syms if s.is_positive}))
    if not shifted.is_polynomial(*syms):
        return False
    return all(coef >= 0 for coef in sympy.Poly(shifted, *syms).coeffs())


def _copied(p: ir.Node, acc: str) -> ir.Load | None:
    """The load a node only copies: ``p.body`` is a Load of p's dtype, or the exact widening of a 16-bit float
    to the GEMM's float32 accumulation (a GEMM reading the 16-bit values does the same arithmetic)."""
    body = p.body
    if isinstance(body, ir.Op) and body.op == "cast" and p.out.dtype == acc == "float32" \
            and isinstance(body.args[0], ir.Load) and body.args[0].dtype in ir.HALF_DTYPES:
        return body.args[0]
    if isinstance(body, ir.Load) and body.dtype == p.out.dtype and body.buffer != p.out.name:
        return body
    return None


def fold_copies_into_operands(prog: ir.Program) -> None:
    """A GEMM operand produced by a node that only copies (a permute or reshape made contiguous: the heads of
    a fused QKV projection, attention's output going back to [tokens, features]) is read through the copy:
    the operand becomes a view of the copy's source, and the copy disappears once nothing else needs it."""
    from tcexport.exporter.lower.ops import gemm_operand

    producers = prog.producers()
    for g in [n for n in prog.nodes if n.kind == "gemm"]:
        batched = g.gemm.batch != 1
        for side, rows, cols in [("a", g.gemm.m, g.gemm.k)] * 4 + [("b", g.gemm.k, g.gemm.n)] * 4:  # chains
            op = getattr(g.gemm, side)
            p = producers.get(op.buffer)
            load = _copied(p, g.gemm.acc_dtype) if p is not None and p.kind == "pointwise" else None
            if load is None:
                continue
            shape = ((g.gemm.batch,) if batched else ()) + (rows, cols)
            at = _operand_index(op, p.out, batched, list(shape))
            src = prog.buffers[load.buffer]
            moved = {ir.ivar(k): e for k, e in enumerate(at)}
            ranges = {ir.ivar(0): g.gemm.batch, ir.ivar(1): rows, ir.ivar(2): cols}
            index = tuple(simplify_in_ranges(ir.simplify_index(sympy.sympify(e).xreplace(moved)), ranges)
                          for e in load.index)
            setattr(g.gemm, side, gemm_operand(src, index, shape, batched))
    eliminate_unread(prog)


def eliminate_unread(prog: ir.Program) -> None:
    """Drop temps nothing reads any more (copies folded away), last to first so chains go too."""
    changed = True
    while changed:
        changed = False
        readers = prog.consumers()
        for n in reversed(prog.nodes):
            if n.out.kind == "temp" and not readers.get(n.out.name):
                prog.nodes.remove(n)
                del prog.buffers[n.out.name]
                changed = True
                break


# ---------------------------------------------------------------------------------------------------------
# pass 2: inlining


def _iterations(n: ir.Node) -> sympy.Expr:
    return ir.product(n.ranges) * ir.product(n.reduce_ranges)


def _cheap(body: ir.Value) -> bool:
    ops = [v for v in ir.walk(body) if isinstance(v, ir.Op)]
    return len(ops) <= 1 and not any(v.op in EXPENSIVE_OPS for v in ops)


INDEX_ONLY_OPS = 24  # most operations an index-only node may have to be recomputed wherever it is read


def _index_only(body: ir.Value) -> bool:
    """A value of the indices and constants alone (no load), small and cheap: recomputing it per element costs
    a few integer operations, where keeping it costs a kernel launch and a round trip through memory. GPT-2's
    mask preparation is a chain of these (position ids, their differences, the sequence starts): four launches."""
    values = list(ir.walk(body))
    ops = [v for v in values if isinstance(v, ir.Op)]
    return not any(isinstance(v, (ir.Load, ir.LoadIndirect)) for v in values) and len(ops) <= INDEX_ONLY_OPS \
        and not any(v.op in EXPENSIVE_OPS for v in ops)


def _rereads_pay(body: ir.Value, readers: int) -> bool:
    """Inlining into ``readers`` nodes reads the body's L inputs once per reader (readers * L); keeping the
    node reads them once, writes it once and reads it once per reader (L + 1 + readers). Without this bound a
    chain of residual adds, each read by the next add and a norm, grows by one input per layer: layer n's norm
    re-adds all n earlier outputs (quadratic in depth). L counts the buffers read, not the index sources of a
    gather; a body of at most two stays inlined (an embedding sum: a launch costs more than its rereads)."""
    sources = {ld.buffer for v in ir.walk(body) if isinstance(v, ir.LoadIndirect)
               for s in v.sources for ld in ir.loads(s)}
    inputs = len({v.buffer for v in ir.walk(body) if isinstance(v, (ir.Load, ir.LoadIndirect))} - sources)
    return inputs <= 2 or readers * inputs <= inputs + 1 + readers


RECOMPUTED_OPS = 16  # most operations a body may have and still be recomputed for a second use


def _sites(p: ir.Node, readers: list) -> int:
    """How many distinct elements of ``p`` its readers load, summed over them: a window's taps each count, and
    hardswish's two reads of x at one index are one."""
    return sum(len({v.index for v in ir.walk(r.body) if isinstance(v, ir.Load) and v.buffer == p.out.name})
               for r in readers)


def _recomputes_work(p: ir.Node, readers: list) -> bool:
    """Whether inlining ``p`` would compute its body several times per element it has: a reader that loads it at
    more than two places (each tap of a depthwise convolution's window or a pooling's), or several readers of a body
    of many operations (the taps' sum itself, read by a pooling and a product). _rereads_pay counts the buffers
    reread, not the work redone."""
    sites = _sites(p, readers)
    ops = sum(1 for v in ir.walk(p.body) if isinstance(v, ir.Op))
    return sites > 2 * len(readers) or (len(readers) > 1 and ops > RECOMPUTED_OPS)


def _taps_reread(prog: ir.Program, p: ir.Node, readers: list) -> bool:
    """Whether inlining a cheap ``p`` into readers that load it at many places (a window's taps) reads its
    inputs more often than keeping it does: ``sites * inputs`` loads against ``inputs + 1 + sites`` (its inputs
    once, its result written once and read at each site). A ReLU before a 3x3 pooling stays inlined (9 against
    11); a residual add before a 7x7 depthwise convolution does not (98 against 52: ConvNeXt's, whose two inputs
    are read through a transpose there, which also kept the window from its padded, vectorised form). Only the
    inputs as large as ``p`` count: a bias is one value per channel."""
    sites = _sites(p, readers)
    size = ir.product(p.ranges)
    inputs = len({v.buffer for v in ir.walk(p.body) if isinstance(v, ir.Load) and v.buffer in prog.buffers
                  and ir.same_size(prog.buffers[v.buffer].numel(), size)})
    return sites > 2 * len(readers) and sites * inputs > inputs + 1 + sites


def inline_pointwise(prog: ir.Program) -> None:
    for p in list(prog.nodes):
        if p.kind != "pointwise" or p.out.kind == "output":
            continue
        readers = prog.consumers().get(p.out.name, [])
        if not readers:
            continue
        if any(r.kind == "gemm" and p.out.name in (r.gemm.a.buffer, r.gemm.b.buffer) for r in readers):
            continue
        if _read_indirectly(prog, p.out.name, readers):
            continue
        recompute = _index_only(p.body) and not any(r.kind == "gemm" for r in readers)
        if not _cheap(p.body) and not recompute and \
                not all(ir.same_size(ir.product(p.ranges), _iterations(r)) for r in readers):
            continue
        if not recompute and not _rereads_pay(p.body, len(readers)):
            continue
        if not recompute and not _cheap(p.body) and _recomputes_work(p, readers):
            continue
        if not recompute and _cheap(p.body) and _taps_reread(prog, p, readers):
            continue
        for r in readers:
            r.body = ir.map_values(r.body, lambda v: ir.subs_index(p.body, {ir.ivar(k): e for k, e in
                                                                            enumerate(v.index)})
                                   if isinstance(v, ir.Load) and v.buffer == p.out.name else v)
        prog.nodes.remove(p)
        del prog.buffers[p.out.name]


# ---------------------------------------------------------------------------------------------------------
# pass 3: grouping into kernels


def _var_map(node: ir.Node, outer_len: int, level: str) -> dict:
    """Map the node's index variables onto the kernel's loop variables (size-1 dims map to 0)."""
    mapping, k = {}, 0
    for d, size in enumerate(node.ranges):
        if size == 1:
            mapping[ir.ivar(d)] = sympy.Integer(0)
        else:
            mapping[ir.ivar(d)] = ovar(k) if k < outer_len else qvar(k - outer_len)
            k += 1
    r = 0
    for d, size in enumerate(node.reduce_ranges):
        mapping[ir.rvar(d)] = sympy.Integer(0) if size == 1 else qvar(r)
        r += 0 if size == 1 else 1
    return mapping


def _same_ranges(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(ir.same_size(x, y) for x, y in zip(a, b))


def _fit(node: ir.Node, k: Kernel) -> str | None:
    """The level at which ``node`` can run inside kernel ``k``, or None."""
    rng = ir.squeeze(node.ranges)
    if node.kind == "reduction":
        red = ir.squeeze(node.reduce_ranges)
        if _same_ranges(rng, k.outer) and (not k.inner and k.kind == "loops" or _same_ranges(red, k.inner)):
            return "reduce"
        return None
    if node.kind != "pointwise" or k.kind != "loops":
        return None
    if _same_ranges(rng, k.outer):
        return "row"
    if k.inner and _same_ranges(rng, k.outer + k.inner):
        return "inner"
    return None


def _stored_at(stage: Stage) -> tuple:
    return tuple(sympy.expand(stage.var_map[ir.ivar(d)]) for d in range(len(stage.node.ranges)))


def _legal(node: ir.Node, level: str, k: Kernel, k_index: int, produced_by: dict) -> bool:
    """Every buffer the node reads comes from an earlier kernel, or from ``k`` at this same row/element."""
    vm = _var_map(node, len(k.outer), level)
    members = {s.node.out.name: s for s in k.stages}
    for b in node.inputs():
        owner = produced_by.get(b)
        if owner is None or owner < k_index:
            continue
        if owner > k_index or b not in members:
            return False
        src = members[b]
        if any(ld.buffer == b for ld in ir.indirect_loads(node.body)):
            return False  # an indirect read may land on any row: the buffer must be complete
        if src.level == "inner" and level != "inner" and level != "reduce":
            return False
        want = _stored_at(src)
        for ld in ir.loads(node.body):
            if ld.buffer == b and tuple(sympy.expand(sympy.sympify(e).xreplace(vm)) for e in ld.index) != want:
                return False
    return True


def group(prog: ir.Program) -> list[Kernel]:
    kernels: list[Kernel] = []
    produced_by: dict[str, int] = {}
    for node in prog.nodes:
        placed = False
        if node.kind != "gemm":
            for ki in range(len(kernels) - 1, -1, -1):
                k = kernels[ki]
                level = _fit(node, k)
                if level and _legal(node, level, k, ki, produced_by):
                    if level == "reduce" and not k.inner:
                        k.inner = ir.squeeze(node.reduce_ranges)
                    k.stages.append(Stage(node, level, _var_map(node, len(k.outer), level)))
                    produced_by[node.out.name] = ki
                    placed = True
                    break
        if not placed:
            kernels.append(new_kernel(node, len(kernels)))
            produced_by[node.out.name] = len(kernels) - 1
    _mark_locals(prog, kernels)
    for i, k in enumerate(kernels):
        k.name = f"k{i}_{_describe(k)}"
    return kernels


def new_kernel(node: ir.Node, index: int) -> Kernel:
    """The kernel of one node alone (a GEMM template, or a loop kernel of its rows), which fusion then grows."""
    if node.kind == "gemm":
        k = Kernel("", "gemm", tuple(node.ranges), ())
        k.stages.append(Stage(node, "gemm", {}))
        return k
    outer = ir.squeeze(node.ranges)
    inner = ir.squeeze(node.reduce_ranges) if node.kind == "reduction" else ()
    k = Kernel("", "loops", outer, inner)
    level = "reduce" if node.kind == "reduction" else "row"
    k.stages.append(Stage(node, level, _var_map(node, len(outer), level)))
    return k


def _mark_locals(prog: ir.Program, kernels: list[Kernel]) -> None:
    consumers = prog.consumers()
    for k in kernels:
        mine = set(k.nodes and [n.out.name for n in k.nodes])
        for s in k.stages:
            name = s.node.out.name
            if s.level in ("reduce", "row") and k.inner and s.node.out.kind != "output":
                if all(c.out.name in mine for c in consumers.get(name, [])):
                    k.local.add(name)


def _describe(k: Kernel) -> str:
    if k.kind == "gemm":
        return "gemm_epilogue" if k.stages[0].node.body is not None else "gemm"
    kinds = [s.node.reduce_op for s in k.stages if s.level == "reduce"]
    return ("reduce_" + "_".join(dict.fromkeys(kinds))) if kinds else "pointwise"


# ---------------------------------------------------------------------------------------------------------


def fuse(prog: ir.Program) -> list[Kernel]:
    merge_common_nodes(prog)
    prog.verify()
    fold_copies_into_operands(prog)
    prog.verify()
    absorb_epilogues(prog)
    prog.verify()
    inline_pointwise(prog)
    prog.verify()
    absorb_epilogues(prog)  # inlining can leave a GEMM output with one reader (x + 0.044715 * x**3 -> GELU)
    prog.verify()
    kernels = group(prog)
    verify_kernels(kernels)
    return kernels
