"""Loop kernels in Triton: one program per block of XBLOCK rows. A reduction accumulates an [XBLOCK, RBLOCK] tile
over the row (in one tile when the config is persistent, in a loop over chunks otherwise) and per-row values are
[XBLOCK, 1]; elementwise stages sweep the row again. Which stages share a sweep is the kernel's own decision
(ir/kernels.py ``Kernel.loops``), read here as the C++ renderer reads it; the tiles are cuda/tiles.py's.
"""

from __future__ import annotations

import sympy

from tcexport.exporter.cuda.exprs import (BLOCK_ZERO, FLOATS, INT_LIMITS, REDUCE_COMBINE, REDUCE_FINAL, REDUCE_INIT,
                                          TL_TYPE, TritonEmitter, compute_dtype, decompose, stored, tindex)
from tcexport.exporter.cuda.scope import LaunchScope
from tcexport.exporter.cuda.tiles import LoopConfig
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import ARG_REDUCTIONS, Kernel, flat_position


def loop_body(sc: LaunchScope, k: Kernel, cfg: LoopConfig) -> list[str]:
    """The body of a loop kernel: one program per XBLOCK rows, each run of stages (Kernel.loops) one sweep."""
    inner = ir.product(k.inner)
    pid = "tl.program_id(0)" + (".to(tl.int64)" if sc.bits == 64 else "")
    ind = "    "
    lines = [f"{ind}xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)" + ("[:, None]" if k.inner else "")]
    lines.append(f"{ind}xmask = xindex < {tindex(ir.product(k.outer))}")
    lines += decompose("xindex", k.outer, "o", ind)
    registers: dict = {}
    written: set = set()
    for loop in k.loops():
        lines += _loop(sc, k, loop, registers, written, cfg, inner, ind)
    return lines


def _row_loop_head(k: Kernel, cfg: LoopConfig, inner, indent: str) -> tuple[list[str], str]:
    """The start of a sweep over the row: a ``for`` over RBLOCK chunks, or one chunk when persistent."""
    lines = []
    body = indent
    if cfg.persistent:
        lines.append(f"{indent}rindex = tl.arange(0, RBLOCK)[None, :]")
    else:
        lines.append(f"{indent}for roffset in range(0, {tindex(inner)}, RBLOCK):")
        body = indent + "    "
        lines.append(f"{body}rindex = roffset + tl.arange(0, RBLOCK)[None, :]")
    lines.append(f"{body}rmask = rindex < {tindex(inner)}")
    lines += decompose("rindex", k.inner, "q", body)
    return lines, body


def _loop(sc: LaunchScope, k, loop, registers, written, cfg, inner, ind) -> list[str]:
    lines: list[str] = []
    reads = {b for s in loop.stages for b in s.node.inputs()}
    if reads & written:
        lines.append(f"{ind}tl.debug_barrier()")  # values this kernel stored earlier, read by other threads
    if loop.level == "row":
        for s in loop.stages:
            kept = ir.kept_elsewhere(s.node, sc.prog.buffers) if s.node.out.name not in k.local else None
            if kept is not None:
                lines += _store_changed(sc, s, kept, registers, written, ind)
                continue
            em = TritonEmitter(sc, registers, ind, "xmask")
            val = em.tensor(ir.subs_index(s.node.body, s.var_map))
            lines += em.lines
            lines += _store(sc, k, s, val, registers, written, ind, "xmask")
        return lines
    head, body = _row_loop_head(k, cfg, inner, ind)
    accs = []
    if loop.level == "reduce":
        for s in loop.stages:
            acc = f"acc_{s.node.out.name}"
            lines += _acc_init(s.node, acc)
            accs.append((s, acc))
    lines += head
    em = TritonEmitter(sc, dict(registers), body, "xmask & rmask")
    for s in loop.stages:
        val = em.tensor(ir.subs_index(s.node.body, s.var_map))
        if loop.level == "reduce":
            em.lines += _acc_step(s.node, f"acc_{s.node.out.name}", val, body, k)
        else:
            em.lines += _store(sc, k, s, val, em.registers, written, body, "xmask & rmask")
    lines += em.lines
    for s, acc in accs:
        final = _acc_final(s.node, acc)
        name = f"v_{s.node.out.name}"
        lines.append(f"{ind}{name} = {final}")
        lines += _store(sc, k, s, name, registers, written, ind, "xmask")
    return lines


def _acc_type(node: ir.Node) -> str:
    dt = node.out.dtype
    if node.reduce_op in ARG_REDUCTIONS:
        return "tl.int64"
    return "tl.int32" if dt == "bool" else TL_TYPE[compute_dtype(dt)]


def _init(node: ir.Node, op: str, dtype: str) -> str:
    if dtype not in FLOATS and op in ("max", "min"):
        lo, hi = INT_LIMITS[dtype]
        return str(lo if op == "max" else hi)
    return REDUCE_INIT[op]


def _acc_init(node: ir.Node, acc: str) -> list[str]:
    shape = "[XBLOCK, RBLOCK]"
    if node.reduce_op in ARG_REDUCTIONS:
        vt = node.body.dtype
        init = _init(node, ARG_REDUCTIONS[node.reduce_op], vt)
        return [f"    {acc}_v = tl.full({shape}, {init}, {TL_TYPE[compute_dtype(vt)]})",
                f"    {acc} = tl.full({shape}, 0, tl.int64)"]
    dt = node.out.dtype
    init = _init(node, node.reduce_op, "int32" if dt == "bool" else dt)
    return [f"    {acc} = tl.full({shape}, {init}, {_acc_type(node)})"]


def _acc_step(node: ir.Node, acc: str, val: str, indent: str, k: Kernel) -> list[str]:
    op = node.reduce_op
    mask = "xmask & rmask"
    if op in ARG_REDUCTIONS:
        pos = tindex(flat_position(k.inner))
        cmp = ">" if op == "argmax" else "<"
        take = f"({mask}) & ({acc}_v == {acc}_v) & (({val} {cmp} {acc}_v) | ({val} != {val}))"
        return [f"{indent}tk = {take}",
                f"{indent}{acc}_v = tl.where(tk, {val}, {acc}_v)",
                f"{indent}{acc} = tl.where(tk, ({pos}).to(tl.int64) + 0 * {acc}, {acc})"]
    v = val if node.out.dtype != "bool" else f"{val}.to(tl.int32)"
    if node.out.dtype == "bool" and op in ("max", "min"):
        combine = f"tl.maximum({acc}, {v})" if op == "max" else f"tl.minimum({acc}, {v})"
    elif node.out.dtype not in FLOATS and op in ("max", "min"):
        combine = f"tl.maximum({acc}, {v})" if op == "max" else f"tl.minimum({acc}, {v})"
    else:
        combine = REDUCE_COMBINE[op].format(acc=acc, v=f"{v}.to({_acc_type(node)})")
    return [f"{indent}{acc} = tl.where({mask}, {combine}, {acc})"]


def _acc_final(node: ir.Node, acc: str) -> str:
    op = node.reduce_op
    if op in ARG_REDUCTIONS:
        return f"tl.reduce(({acc}_v, {acc}), 1, _{op}, keep_dims=True)[1]"
    if node.out.dtype not in FLOATS and op in ("max", "min"):
        fn = "tl.max" if op == "max" else "tl.min"
        text = f"{fn}({acc}, 1, keep_dims=True)"
    else:
        text = REDUCE_FINAL[op].format(acc=acc)
    return f"({text} != 0)" if node.out.dtype == "bool" else text


def _store(sc: LaunchScope, k, s, val: str, registers: dict, written: set, indent: str, mask: str) -> list[str]:
    name = s.node.out.name
    registers[name] = val
    if name in k.local:
        return []
    sc.use(name)
    written.add(name)
    flat = s.node.out.flat_index([s.var_map.get(ir.ivar(d), 0) for d in range(len(s.node.ranges))])
    offset = tindex(flat) + ("" if sympy.sympify(flat).free_symbols else BLOCK_ZERO[mask])
    return [f"{indent}tl.store({name} + {offset}, {stored(val, s.node.out.dtype)}, mask={mask})"]


def _store_changed(sc: LaunchScope, s, kept: tuple, registers: dict, written: set, ind: str) -> list[str]:
    """A node that changes its output only where a condition holds (ir.kept_elsewhere): the new value is stored
    there alone, and the old one copied elsewhere only when output and input are two arrays (a state the loader
    updates in place is one: a decode step's cache write touches one row)."""
    c, a, old = (ir.subs_index(v, s.var_map) for v in kept)
    out = s.node.out
    em = TritonEmitter(sc, registers, ind, "xmask")
    cond = em.tensor(c)
    val = em.tensor(a)  # its reads are safe anywhere (a gather's index is range-checked); only its store is masked
    flat = out.flat_index([s.var_map.get(ir.ivar(d), 0) for d in range(len(s.node.ranges))])
    at = tindex(flat) + ("" if sympy.sympify(flat).free_symbols else BLOCK_ZERO["xmask"])
    src = sc.prog.buffers[old.buffer]
    src_flat = src.flat_index(old.index)
    src_at = tindex(src_flat) + ("" if sympy.sympify(src_flat).free_symbols else BLOCK_ZERO["xmask"])
    sc.use(out.name)
    sc.use(src.name)
    written.add(out.name)
    copy = f"xmask & ({cond} == 0)"
    return em.lines + [
        f"{ind}tl.store({out.name} + {at}, {stored(val, out.dtype)}, mask=xmask & {cond})",
        f"{ind}if {out.name}.to(tl.int64, bitcast=True) != {src.name}.to(tl.int64, bitcast=True):",
        f"{ind}    tl.store({out.name} + {at}, tl.load({src.name} + {src_at}, mask={copy}), "
        f"mask={copy})"]
