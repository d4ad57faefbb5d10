"""Attention kernels in Triton (the GPU schedule fused them: schedule/attention.py): flash attention over blocks of
keys with an online softmax, the scores GEMM's epilogue (scale, mask) and the PV GEMM's epilogue fused in; the
scores and probabilities never reach memory. Its body does not depend on its tiles, which are data
(cuda/tiles.py ``attention_config``, or a tuning).
"""

from __future__ import annotations

import sympy
from torch.utils._sympy.functions import FloorDiv

from tcexport.exporter.cuda.exprs import HALF, TL_TYPE, TritonEmitter, stored, tindex
from tcexport.exporter.cuda.gemm import (batch_vars, dot_kind, epilogue, gemm_coords, matrix_coords, operand_ptr,
                                        rows_address)
from tcexport.exporter.cuda.scope import LaunchScope
from tcexport.exporter.cuda.tiles import AttentionConfig, Geometry, attention_config
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.bounds import symbol_bounds, upper_bound
from tcexport.exporter.ir.kernels import Kernel
from tcexport.exporter.schedule.attention import scores as attention_scores, skips_masked_keys
from tcexport.exporter.schedule.split_kv import SPLIT_M


def attention_body(sc: LaunchScope, k: Kernel) -> list[str]:
    """Flash attention: per block of query rows, loop over blocks of keys computing the scores (with the
    scores GEMM's epilogue: scale, mask), an online softmax (running max and sum, the accumulator rescaled
    as the max grows) and the probabilities times the values; then the PV GEMM's epilogue. A row whose
    scores are all -inf gives NaN, as the unfused softmax does."""
    qk, pv = k.stages[0].node, k.stages[-1].node
    g1, g2 = qk.gemm, pv.gemm
    v_dtype = sc.prog.buffers[g2.b.buffer].dtype
    precision1, widen_q, widen_k = dot_kind(sc.prog, g1)
    # against 16-bit values the float32 probabilities go in as two 16-bit parts, p = hi + lo, in two native
    # dots: about 16 bits of p where flash attention keeps 8 (bf16; that was 2% off on a bf16 op-table
    # sample) and tf32 10, and faster than the tf32 dot with widened values (H200, GPT-2 small at batch 8)
    split_p = v_dtype in HALF
    cast = ".to(tl.int64)" if sc.bits == 64 else ""
    ind, body = "    ", "        "
    split = k.kv_split
    group = 1 if split is None else split.group
    lines = [
        f"{ind}M = {tindex(g1.m)}",
        f"{ind}N = {tindex(g1.n)}",
        f"{ind}D = {tindex(g1.k)}",
        f"{ind}DV = {tindex(g2.n)}",
        f"{ind}pid = tl.program_id(0){cast}",
    ]
    kv_bid = _rows(group, cast, ind, lines)
    lines += [
        f"{ind}rd = tl.arange(0, BD)",
        f"{ind}rv = tl.arange(0, BDV)",
        f"{ind}rn0 = tl.arange(0, BN)",
    ]
    q_ptrs = operand_ptr(sc, g1.a, "bid", "rm[:, None]", "rd[None, :]", lines, ind)
    lines += [
        f"{ind}q = tl.load({q_ptrs}, mask=rmask[:, None] & (rd[None, :] < D), other=0.0){widen_q}",
        f"{ind}m_i = tl.full((BM,), float('-inf'), tl.float32)",
        f"{ind}l_i = tl.zeros((BM,), dtype=tl.float32)",
        f"{ind}acc = tl.zeros((BM, BDV), dtype=tl.float32)",
    ]
    if split is None:
        lines.append(f"{ind}for kk in range(0, tl.cdiv(N, BN)):")
    else:  # this program's slice of the key blocks (schedule/split_kv.py), the blocks dealt evenly: 17 blocks
        # over 16 slices are 2 for one slice and 1 for the others, where slices of cdiv(17, 16) leave 7 idle
        lines += [f"{ind}sid = tl.program_id(2){cast}",
                  f"{ind}nb = tl.cdiv(N, BN)",
                  f"{ind}for kk in range(sid * nb // SPLITS, (sid + 1) * nb // SPLITS):"]
    lines += [f"{body}rn = kk * BN + rn0"]
    lines.append(f"{body}smask = rmask[:, None] & (rn[None, :] < N)")
    if skips_masked_keys(k):  # a block whose scores are -inf whatever q and k are is skipped
        lines += [f"{body}s_zero = tl.zeros((BM, BN), dtype=tl.float32)"]
        zero = _scores(sc, k, "s_zero", body, lines)
        lines += [f"{body}if tl.sum(tl.sum(((({zero}) != float('-inf')) & smask).to(tl.int32), 1), 0) > 0:"]
        body += "    "
    k_ptrs = operand_ptr(sc, g1.b, kv_bid, "rd[:, None]", "rn[None, :]", lines, body)
    lines += [
        f"{body}kt = tl.load({k_ptrs}, mask=(rd[:, None] < D) & (rn[None, :] < N), other=0.0){widen_k}",
        f"{body}s = tl.dot(q, kt{precision1})",
    ]
    s = _scores(sc, k, "s", body, lines)
    v_ptrs = operand_ptr(sc, g2.b, kv_bid, "rn[:, None]", "rv[None, :]", lines, body)
    lines += _online_softmax_step(s, v_ptrs, v_dtype if split_p else None, body)
    lines.append(f"{body}m_i = m_new")
    if split is not None:
        return lines + _slice_stores(sc, k, split, ind)
    lines += [
        f"{ind}acc = acc / l_i[:, None]",
        f"{ind}mask = rmask[:, None] & (rv[None, :] < DV)",
    ]
    if pv.body is not None:
        lines += gemm_coords(pv, "rm[:, None]", "rv[None, :]", ind)
    val = epilogue(sc, pv, "acc", "mask", ind, lines)
    sc.addresses.append(rows_address(g1, g2.n))
    lines.append(f"{ind}tl.store({sc.use(pv.out.name)} + bid * (M * DV) + rm[:, None] * DV + rv[None, :], "
                 f"{stored(val, pv.out.dtype)}, mask=mask)")
    return lines


def _rows(group: int, cast: str, ind: str, lines: list) -> str:
    """A program's query rows (``rm``, ``rmask``) and batch entries (``bid``); returns the name of the batch entry
    K and V are read at. With a group of heads (schedule/split_kv.py) its rows are (head j of the group, query row m)
    pairs, row-major, each with a batch entry of its own, and the group's K/V view is its first entry's."""
    if group == 1:
        lines += [f"{ind}bid = tl.program_id(1){cast}",
                  f"{ind}rm = pid * BM + tl.arange(0, BM)",
                  f"{ind}rmask = rm < M"]
        return "bid"
    lines += [f"{ind}rt = pid * BM + tl.arange(0, BM)",
              f"{ind}rmask = rt < M * {group}",
              f"{ind}rm = rt % M",
              f"{ind}bidv = tl.program_id(1){cast} * {group} + rt // M",
              f"{ind}bid = bidv[:, None]",
              f"{ind}kv_bid = tl.program_id(1){cast} * {group}"]
    return "kv_bid"


def _slice_stores(sc: LaunchScope, k: Kernel, split, ind: str) -> list[str]:
    """A slice's results: its unnormalised output and its running max and sum, at (slice, batch, row) (a
    program of a group has a batch entry per row)."""
    acc_buf = sc.prog.buffers[split.acc]
    rows = tindex(acc_buf.shape[2])
    at = f"((sid * ({tindex(acc_buf.shape[1])}) + {'bid' if split.group == 1 else 'bidv'}) * {rows} + rm)"
    return [
        f"{ind}tl.store({sc.use(split.acc)} + {at}[:, None] * DV + rv[None, :], acc, "
        f"mask=rmask[:, None] & (rv[None, :] < DV))",
        f"{ind}tl.store({sc.use(split.stats)} + {at} * 2, m_i, mask=rmask)",
        f"{ind}tl.store({split.stats} + {at} * 2 + 1, l_i, mask=rmask)",
    ]


def _scores(sc: LaunchScope, k: Kernel, product: str, ind: str, lines: list) -> str:
    """The softmax's input for the block of scores whose product q·k is ``product``: the scores GEMM's epilogue
    (scale, mask add), then what the softmax applied to it (a mask fused there)."""
    qk = k.stages[0].node
    if qk.body is not None:
        lines += gemm_coords(qk, "rm[:, None]", "rn[None, :]", ind)
    s = epilogue(sc, qk, product, "smask", ind, lines)
    value, s_load = attention_scores(k)
    if value != s_load:
        lines += matrix_coords(k.stages[3].node.out.shape, "rm[:, None]", "rn[None, :]", ind)
        shape = k.stages[3].node.out.shape
        em = TritonEmitter(sc, {}, ind, "smask", col=ir.ivar(len(shape) - 1), scalars=batch_vars(shape))
        em.memo[s_load] = s
        s = em.tensor(value)
        lines += em.lines
    return s


def attention_tiles(prog: ir.Program, k: Kernel) -> AttentionConfig:
    """The heuristic tiles of an attention kernel (tiles.attention_config) from its head dims and query rows; a
    slice kernel of split-KV runs for at most SPLIT_M rows a head, whatever the rows' range (a decode step: one),
    times the heads of its group."""
    g1, g2 = k.stages[0].node.gemm, k.stages[-1].node.gemm
    q_dtype = prog.buffers[g1.a.buffer].dtype
    rows = upper_bound(g1.m, symbol_bounds(prog))
    if k.kv_split is not None:
        rows = (SPLIT_M if rows is None else min(rows, SPLIT_M)) * k.kv_split.group
    return attention_config(q_dtype, int(g1.k), int(g2.n), rows)


def attention_geometry(k: Kernel, cfg: AttentionConfig) -> Geometry:
    g1 = k.stages[0].node.gemm
    slices, group = (k.kv_split.slices, k.kv_split.group) if k.kv_split is not None else (1, 1)
    grid = (FloorDiv(g1.m * group + cfg.bm - 1, cfg.bm), FloorDiv(sympy.sympify(g1.batch), group),
            sympy.Integer(slices))
    constexprs = {"BM": cfg.bm, "BN": cfg.bn, "BD": cfg.bd, "BDV": cfg.bdv}
    if k.kv_split is not None:
        constexprs["SPLITS"] = slices
    return Geometry(grid, constexprs, cfg.num_warps, cfg.num_stages)


def _online_softmax_step(s: str, v_ptrs: str, split_dtype: str | None, body: str) -> list[str]:
    """One block of keys: the running max and sum updated, the accumulator rescaled and the probabilities times
    the values added (as two 16-bit parts when ``split_dtype`` is the values' 16-bit type)."""
    lines = [
        f"{body}s = tl.where(rn[None, :] < N, {s}, float('-inf'))",
        f"{body}m_new = tl.maximum(m_i, tl.max(s, 1))",
        f"{body}m_use = tl.where(m_new == float('-inf'), 0.0, m_new)",
        f"{body}alpha = tl.exp(m_i - m_use)",
        f"{body}p = tl.exp(s - m_use[:, None])",
        f"{body}l_i = l_i * alpha + tl.sum(p, 1)",
        f"{body}v = tl.load({v_ptrs}, mask=(rn[:, None] < N) & (rv[None, :] < DV), other=0.0)",
    ]
    if split_dtype is not None:
        return lines + [
            f"{body}p_hi = p.to({TL_TYPE[split_dtype]})",
            f"{body}acc = tl.dot((p - p_hi.to(tl.float32)).to({TL_TYPE[split_dtype]}), v, acc * alpha[:, None])",
            f"{body}acc = tl.dot(p_hi, v, acc)",
        ]
    return lines + [f'{body}acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")']
