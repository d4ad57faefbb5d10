"""GEMM kernels in Triton: a tiled ``tl.dot`` template whose epilogue is the kernel's pointwise body, evaluated
on the accumulator tile before the only store; one program per tile in grouped order, or (a vocabulary-sized
16-bit GEMM, when TMA is allowed) persistent, one program per SM reading the operands through TMA descriptors.
The helpers that bind a tile's coordinates and read operand views are shared with cuda/attention.py.

Which config a launch takes is decided before rendering (cuda/tiles.py, ``gemm_variants_of``); the template reads
only ``GemmBody``, the part of the config its text depends on.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from torch.utils._sympy.functions import FloorDiv

from tcexport.formats.manifest import SM_COUNT

from tcexport.exporter.cuda.exprs import HALF, TL_TYPE, TritonEmitter, decompose, stored, tindex
from tcexport.exporter.cuda.scope import LaunchScope
from tcexport.exporter.cuda.tiles import GemmConfig, Geometry, gemm_config, gemm_variants
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.bounds import INT32_LIMIT, lower_bound, symbol_bounds, upper_bound
from tcexport.exporter.ir.kernels import Kernel


@dataclass(frozen=True)
class GemmBody:
    """The template decisions the text depends on (the rest of a config is block sizes, grid, warps, stages)."""

    persistent: bool
    even_k: bool
    even_n: bool


def operand_ptr(sc: LaunchScope, op: ir.GemmOperand, bid: str, row: str, col: str, lines: list, ind: str) -> str:
    """Pointers to elements (bid, row, col) of an operand view; ``row``/``col`` are broadcastable blocks.
    An index view binds the three coordinates to temporaries (tindex prints them as they are)."""
    if op.index is None:
        bid_, row_, col_ = (sympy.Symbol(v, integer=True, nonnegative=True) for v in ("t_b", "t_r", "t_c"))
        sc.addresses.append((sympy.sympify(op.offset) + bid_ * sympy.sympify(op.batch_stride) +
                               row_ * sympy.sympify(op.row_stride) + col_ * sympy.sympify(op.col_stride), col_))
        return (f"{sc.use(op.buffer)} + ({tindex(op.offset)} + {bid} * {tindex(op.batch_stride)}) "
                f"+ ({row}) * {tindex(op.row_stride)} + ({col}) * {tindex(op.col_stride)}")
    names = []
    for c in (bid, row, col):  # (batch, row, col): see ir.GemmOperand
        names.append(f"t{next(sc.names)}")
        lines.append(f"{ind}{names[-1]} = {c}")
    mapping = {ir.ivar(d): sympy.Symbol(n, integer=True, nonnegative=True) for d, n in enumerate(names)}
    flat = sc.prog.buffers[op.buffer].flat_index(tuple(sympy.sympify(e).xreplace(mapping) for e in op.index))
    sc.addresses.append((flat, mapping[ir.ivar(2)]))
    return f"{sc.use(op.buffer)} + {tindex(flat)}"


def rows_address(g: ir.Gemm, n) -> tuple:
    """(element offset, column variable) of ``bid * (m * n) + row * n + col``, where a template stores its
    tile (``bid`` is 0 in an unbatched GEMM)."""
    bid, row, col = (sympy.Symbol(v, integer=True, nonnegative=True) for v in ("t_b", "t_r", "t_c"))
    batched = int(sympy.sympify(g.batch) != 1)
    return bid * sympy.sympify(g.m) * sympy.sympify(n) * batched + row * sympy.sympify(n) + col, col


def gemm_coords(node: ir.Node, row: str, col: str, ind: str) -> list[str]:
    """Lines binding i0, i1, ... (the node's output position) for GEMM element (bid, row, col). A batched
    output laid out [batch dims..., m, n] maps directly, and an unbatched [rows dims..., n] splits only the
    row (a division per row, not per element: a residual add indexed per element cost GPT-2's projections
    up to 0.5 us each on an H200); any other shape goes through the row-major position."""
    g, ranges = node.gemm, node.ranges
    if matrix_shaped(node):
        return matrix_coords(ranges, row, col, ind)
    if row_split(node):
        return decompose(row, ranges[:-1], "i", ind) + [f"{ind}i{len(ranges) - 1} = {col}"]
    flat = f"bid * ({tindex(g.m * g.n)}) + {row} * {tindex(g.n)} + {col}"
    return [f"{ind}flat_e = {flat}"] + decompose("flat_e", ranges, "i", ind)


def col_var(node: ir.Node):
    """The index variable ``_gemm_coords`` binds to the tile's column, if it binds one directly."""
    direct = matrix_shaped(node) or row_split(node)
    return ir.ivar(len(node.ranges) - 1) if direct else None


def matrix_shaped(node: ir.Node) -> bool:
    """Whether a GEMM's output is laid out [batch dims..., m, n]."""
    g, ranges = node.gemm, node.ranges
    return len(ranges) >= 2 and ir.same_size(ranges[-1], g.n) and ir.same_size(ranges[-2], g.m) and \
        ir.same_size(ir.product(ranges[:-2]), g.batch)


def row_split(node: ir.Node) -> bool:
    """Whether an unbatched GEMM's output is [row dims..., n]: its last index is the column alone."""
    g, ranges = node.gemm, node.ranges
    return sympy.sympify(g.batch) == 1 and len(ranges) >= 2 and ir.same_size(ranges[-1], g.n) and \
        ir.same_size(ir.product(ranges[:-1]), g.m)


def axis_masks(node: ir.Node) -> list:
    """[(index variables, mask)]: an epilogue load that reads by the column alone (a bias) takes the column
    mask and loads one row of the tile, not all of it; one that reads by the row alone takes the row mask."""
    if not row_split(node):
        return []
    last = len(node.ranges) - 1
    return [({ir.ivar(last)}, "(rn[None, :] < N)"), ({ir.ivar(d) for d in range(last)}, "(rm[:, None] < M)")]


def batch_vars(shape: tuple) -> frozenset:
    """The index variables matrix_coords binds from ``bid``: one value per program, not a block."""
    return frozenset(ir.ivar(d) for d in range(len(shape) - 2))


def matrix_coords(shape: tuple, row: str, col: str, ind: str) -> list[str]:
    """i0, i1, ... of a [batch dims..., rows, cols] position: the batch dims from ``bid``."""
    r = len(shape)
    return decompose("bid", shape[:-2], "i", ind) + [f"{ind}i{r - 2} = {row}", f"{ind}i{r - 1} = {col}"]


def epilogue(sc: LaunchScope, node: ir.Node, acc: str, mask: str, ind: str, lines: list, axis_masks=()) -> str:
    """The value a GEMM node stores: its epilogue body with Load(out, i...) bound to ``acc`` (ir.Gemm)."""
    if node.body is None:
        return acc
    here = ir.Load(node.gemm.acc_dtype, node.out.name, tuple(ir.ivar(d) for d in range(len(node.ranges))))
    em = TritonEmitter(sc, {}, ind, mask, axis_masks, col=col_var(node), scalars=batch_vars(node.ranges)
                       if matrix_shaped(node) else frozenset())
    em.memo[here] = acc
    val = em.tensor(node.body)
    lines += em.lines
    return val


def divides(block: int, e) -> bool:
    e = sympy.sympify(e)
    return bool(e.is_Integer) and int(e) % block == 0


def dot_kind(prog: ir.Program, g: ir.Gemm) -> tuple[str, str, str]:
    """(tl.dot precision argument, widening of A, widening of B). Full-precision float32 dots, except a
    float32 operand times a 16-bit one (attention's probabilities times bf16 values): tf32 holds the 16-bit
    operand exactly and rounds the other to 11 significant bits, finer than the 16-bit rounding eager's
    fused attention applies there, and it runs on the tensor cores."""
    a_dtype = prog.buffers[g.a.buffer].dtype
    b_dtype = prog.buffers[g.b.buffer].dtype
    native = a_dtype == b_dtype
    precision = "" if native and a_dtype in HALF else \
        (', input_precision="tf32"' if not native and g.acc_dtype == "float32" else ', input_precision="ieee"')
    acc_t = TL_TYPE[g.acc_dtype]
    widen_a = "" if native or a_dtype not in HALF else f".to({acc_t})"
    widen_b = "" if native or b_dtype not in HALF else f".to({acc_t})"
    return precision, widen_a, widen_b


def tma_views(prog: ir.Program, g: ir.Gemm):
    """(A's, B's) descriptor view, or None when a TMA descriptor cannot read an operand. Each view is
    (descriptor dims, row stride, whether a loaded block is [K, rows] and needs a transpose): a 16-bit
    unbatched operand at offset 0 with one contiguous dim and a static row stride of whole 16-byte units,
    which is what TMA addresses (the buffer itself is 16-byte aligned, SPEC §6a), and dims below 2**31."""
    dtypes = {prog.buffers[op.buffer].dtype for op in (g.a, g.b)}
    if len(dtypes) != 1 or not dtypes <= set(HALF) or sympy.sympify(g.batch) != 1:
        return None
    bounds = symbol_bounds(prog)
    if any(upper_bound(e, bounds) is None or upper_bound(e, bounds) > INT32_LIMIT for e in (g.m, g.n, g.k)):
        return None
    views = []
    # A is [m, k] and B [k, n]: (dim a block's rows run along, the other dim) for each
    for op, outer, inner in ((g.a, "M", "K"), (g.b, "K", "N")):
        if op.index is not None or sympy.sympify(op.offset) != 0:
            return None
        row, col = sympy.sympify(op.row_stride), sympy.sympify(op.col_stride)
        if col == 1 and row.is_Integer and int(row) % 8 == 0:
            views.append(((outer, inner), int(row), False))
        elif row == 1 and col.is_Integer and int(col) % 8 == 0:
            views.append(((inner, outer), int(col), True))
        else:
            return None
    return tuple(views)


def persistent_head(sc: LaunchScope, g: ir.Gemm, cast: str, ind: str) -> tuple[list, str]:
    """The persistent template's head, up to its accumulated tile: each program takes tiles
    program_id, program_id + num_programs, ... in grouped order; the operands come in through TMA
    descriptors (whose loads zero-fill past the dims, so no masks). Returns (lines, the tile loop's indent)."""
    blocks = {"M": "BM", "N": "BN", "K": "BK"}
    starts = {"M": "pid_m * BM", "N": "pid_n * BN", "K": "kk * BK"}
    lines, loads = [], []
    for name, op, (dims, stride, transposed) in zip(("a", "b"), (g.a, g.b), tma_views(sc.prog, g)):
        lines.append(f"{ind}{name}_desc = tl.make_tensor_descriptor({sc.use(op.buffer)}, shape=[{dims[0]}, {dims[1]}], "
                     f"strides=[{stride}, 1], block_shape=[{blocks[dims[0]]}, {blocks[dims[1]]}])")
        loads.append(f"{name}_desc.load([{starts[dims[0]]}, {starts[dims[1]]}])" + (".T" if transposed else ""))
    body = ind + "    "
    lines += [  # TMA takes 32-bit coordinates: the tile arithmetic stays 32-bit (the dims are below 2**31)
        f"{ind}num_m = tl.cast(num_m, tl.int32)",
        f"{ind}num_n = tl.cast(num_n, tl.int32)",
        f"{ind}k_steps = tl.cast(tl.cdiv(K, BK), tl.int32)",
        f"{ind}for tile in tl.range(tl.program_id(0), num_m * num_n, tl.num_programs(0), flatten=True):",
        f"{body}group = GROUP_M * num_n",
        f"{body}first_m = (tile // group) * GROUP_M",
        f"{body}group_m = tl.minimum(num_m - first_m, GROUP_M)",
        f"{body}pid_m = first_m + (tile % group) % group_m",
        f"{body}pid_n = (tile % group) // group_m",
        f"{body}acc = tl.zeros((BM, BN), dtype={TL_TYPE[g.acc_dtype]})",
        f"{body}for kk in range(0, k_steps):",
        f"{body}    a = {loads[0]}",
        f"{body}    b = {loads[1]}",
        f"{body}    acc = tl.dot(a, b, acc)",
        # the tile's indices only after its loop (live across it, they took registers from the pipeline), and
        # its mask in 32 bits: with 64-bit indices there, GPT-2's LM head kernel took 202 us alone against 143
        # (python -m bench.probes.lm_head); the epilogue and the store take them widened
        f"{body}rm = pid_m * BM + tl.arange(0, BM)",
        f"{body}rn = pid_n * BN + tl.arange(0, BN)",
        f"{body}mask = (rm[:, None] < tl.cast(M, tl.int32)) & (rn[None, :] < tl.cast(N, tl.int32))",
    ]
    if cast:
        lines += [f"{body}rm = rm{cast}", f"{body}rn = rn{cast}"]
    return lines, body


def gemm_body(sc: LaunchScope, k: Kernel, body: GemmBody) -> list[str]:
    """The GEMM template: its head (one program per tile, or persistent over TMA descriptors), then the kernel's
    epilogue on the accumulator tile and the only store."""
    node = k.stages[0].node
    g = node.gemm
    cast = ".to(tl.int64)" if sc.bits == 64 else ""
    ind = "    "
    lines = [
        f"{ind}M = {tindex(g.m)}",
        f"{ind}N = {tindex(g.n)}",
        f"{ind}K = {tindex(g.k)}",
        f"{ind}num_m = tl.cdiv(M, BM)",
        f"{ind}num_n = tl.cdiv(N, BN)",
    ]
    if body.persistent:
        lines.append(f"{ind}bid = 0")
        head, ind = persistent_head(sc, g, cast, ind)
        lines += head
    else:
        lines += tile_head(sc, g, body, cast, ind)
        lines.append(f"{ind}mask = (rm[:, None] < M) & (rn[None, :] < N)")
    if node.body is not None:
        lines += gemm_coords(node, "rm[:, None]", "rn[None, :]", ind)
    val = epilogue(sc, node, "acc", "mask", ind, lines, axis_masks(node))
    sc.addresses.append(rows_address(g, g.n))
    lines.append(f"{ind}tl.store({sc.use(node.out.name)} + bid * (M * N) + rm[:, None] * N + rn[None, :], "
                 f"{stored(val, node.out.dtype)}, mask=mask)")
    return lines


def gemm_geometry(k: Kernel, cfg: GemmConfig, when) -> Geometry:
    """A GEMM launch's grid (its tiles, or at most one program per SM when persistent, times the 0/1 factor of
    the shapes it runs for), block sizes, warps and stages."""
    g = k.stages[0].node.gemm
    tiles = FloorDiv(g.m + cfg.bm - 1, cfg.bm) * FloorDiv(g.n + cfg.bn - 1, cfg.bn)
    if cfg.persistent:
        grid = (sympy.Min(sympy.Symbol(SM_COUNT, integer=True, positive=True), tiles) * when,
                sympy.Integer(1), sympy.Integer(1))
    else:
        grid = (tiles * when, sympy.sympify(g.batch), sympy.Integer(1))
    constexprs = {"BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk, "GROUP_M": cfg.group_m}
    return Geometry(grid, constexprs, cfg.num_warps, cfg.num_stages)


def gemm_body_plan(k: Kernel, cfg: GemmConfig) -> GemmBody:
    """What of ``cfg`` reaches the template's text: persistence, and whether BK divides K and BN divides N (a
    mask that varies along an operand's contiguous dim stops its loads from vectorising: a dim the block
    divides needs none). Two configs with one plan render one body."""
    g = k.stages[0].node.gemm
    return GemmBody(cfg.persistent, divides(cfg.bk, g.k), divides(cfg.bn, g.n))


def gemm_variants_of(prog: ir.Program, k: Kernel, tma: bool) -> list:
    """[(suffix, 0/1 factor, config)] of a GEMM kernel (tiles.gemm_variants) over the rows it runs for (all of
    them, or the band split_k.py gave it); ``tma``: persistent TMA GEMMs are allowed (CudaOptions.tma)."""
    g = k.stages[0].node.gemm
    a_dtype = prog.buffers[g.a.buffer].dtype
    dtype = a_dtype if a_dtype == prog.buffers[g.b.buffer].dtype else g.acc_dtype
    bounds = symbol_bounds(prog)
    m_max, n_max, k_max = (upper_bound(e, bounds) for e in (g.m, g.n, g.k))
    m_min = lower_bound(g.m, prog)
    when = sympy.Integer(1)
    if k.rows is not None:  # split_k.py's band: rows above lo, up to hi
        lo, hi = k.rows
        m_min = max(m_min, lo + 1)
        m_max = hi if m_max is None else (m_max if hi is None else min(m_max, hi))
        when = k.when if k.when is not None else when
    tma = tma and tma_views(prog, g) is not None
    batch = int(g.batch) if sympy.sympify(g.batch).is_Integer else 1
    return [(suffix, when * band, cfg) for suffix, band, cfg in
            gemm_variants(dtype, g.m, m_max, n_max, k_max, tma=tma, m_min=m_min, b_nk=weight_nk(g.b), batch=batch)]


def weight_nk(op: ir.GemmOperand) -> bool | None:
    """Whether B ([K, N] as the GEMM reads it) is stored [N, K] (a Linear's weight: K contiguous) or [K, N] (N
    contiguous), or None for any other view (an index view, neither dim contiguous): the two layouts load
    differently and took different tiles when measured (cuda/gemm_table.py); another view keeps the heuristics."""
    if op.index is not None or op.rows is not None:
        return None
    row, col = sympy.sympify(op.row_stride), sympy.sympify(op.col_stride)
    return True if row == 1 and col != 1 else False if col == 1 else None


def tile_head(sc: LaunchScope, g: ir.Gemm, body: GemmBody, cast: str, ind: str) -> list[str]:
    """The one-program-per-tile template's head, up to its accumulated tile: program (pid, bid) takes tile
    pid of batch bid in grouped order, and reads the operands through pointers."""
    precision, widen_a, widen_b = dot_kind(sc.prog, g)
    lines = [
        f"{ind}pid = tl.program_id(0){cast}",
        f"{ind}bid = tl.program_id(1){cast}",
        f"{ind}group = GROUP_M * num_n",
        f"{ind}first_m = (pid // group) * GROUP_M",
        f"{ind}group_m = tl.minimum(num_m - first_m, GROUP_M)",
        f"{ind}pid_m = first_m + (pid % group) % group_m",
        f"{ind}pid_n = (pid % group) // group_m",
        f"{ind}rm = pid_m * BM + tl.arange(0, BM)",
        f"{ind}rn = pid_n * BN + tl.arange(0, BN)",
        f"{ind}rk = tl.arange(0, BK)",
        f"{ind}acc = tl.zeros((BM, BN), dtype={TL_TYPE[g.acc_dtype]})",
    ]
    even_k, even_n = body.even_k, body.even_n
    pre: list[str] = []
    a_ptrs = operand_ptr(sc, g.a, "bid", "rm[:, None]", "kk * BK + rk[None, :]", pre, ind + "    ")
    b_ptrs = operand_ptr(sc, g.b, "bid", "kk * BK + rk[:, None]", "rn[None, :]", pre, ind + "    ")
    a_mask = "(rm[:, None] < M)" + ("" if even_k else " & kmask[None, :]")
    b_mask = " & ".join(([] if even_k else ["kmask[:, None]"]) + ([] if even_n else ["(rn[None, :] < N)"]))
    lines += [f"{ind}for kk in range(0, tl.cdiv(K, BK)):"] + pre
    lines += [] if even_k else [f"{ind}    kmask = rk < K - kk * BK"]
    lines += [
        f"{ind}    a = tl.load({a_ptrs}, mask={a_mask}, other=0.0){widen_a}",
        f"{ind}    b = tl.load({b_ptrs}" + (f", mask={b_mask}, other=0.0" if b_mask else "") + f"){widen_b}",
    ]
    return lines + [f"{ind}    acc = tl.dot(a, b, acc{precision})"]
