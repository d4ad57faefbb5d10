"""Attention as one C++ kernel (schedule/cpu.py decides where): per (batch·head, block of BM query rows), a loop
over blocks of BN keys with an online softmax, as the GPU's flash attention does. The scores never reach
memory, so long sequences stop streaming a [rows, keys] matrix through it three times (softmax's max, sum and
normalising sweeps), and a block of keys whose scores are -inf whatever q and k are (a causal or padding mask,
the empty part of a static KV cache: schedule/attention.skips_masked_keys) is skipped before its keys are read.

A block's two products are GEMMs on blocks gathered into float32 (``tc_sgemm_block``: the AVX-512 kernel of the
prelude, else the BLAS); the softmax steps between them are vectorised loops along the keys.
"""

from __future__ import annotations

import sympy

from tcexport.exporter.cpu.values import CppEmitter, cindex, loaded, stored
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import Kernel
from tcexport.exporter.schedule.attention import scores as attention_scores, skips_masked_keys

BM, BN = 32, 64  # query rows a program, keys a step
MAX_HEAD_DIM = 128  # heads up to this wide (wider ones keep the three kernels)


def _element(prog: ir.Program, op: ir.GemmOperand, b, r, c) -> str:
    """The C++ element (b, r, c) of an operand view, loaded as its compute type."""
    b, r, c = (sympy.sympify(x) for x in (b, r, c))
    buf = prog.buffers[op.buffer]
    if op.index is None:
        flat = op.offset + b * op.batch_stride + r * op.row_stride + c * op.col_stride
    else:
        flat = buf.flat_index(tuple(sympy.sympify(e).xreplace({ir.ivar(0): b, ir.ivar(1): r, ir.ivar(2): c})
                                    for e in op.index))
    return loaded(buf.dtype, f"{op.buffer}[{cindex(flat)}]")


def matrix_shaped(shape: tuple, m, n) -> bool:
    """[batch dims..., m, n]: a position's last two indices are its row and key, the rest come from the batch."""
    return len(shape) >= 2 and ir.same_size(shape[-1], n) and ir.same_size(shape[-2], m)


def _bind(shape: tuple, row: str, col: str, indent: str) -> list[str]:
    """C++ variables i0, i1, ... (the IR's index variables) for a [batch dims..., rows, cols] position: the batch
    dims from the program's batch·head ``o0`` (row-major), then ``row`` and ``col``. Each index space binds them
    in a block of its own."""
    r = len(shape)
    lines, inner = [], sympy.Integer(1)
    for d in range(r - 3, -1, -1):
        q = "o0" if inner == 1 else f"(o0 / {cindex(inner)})"
        lines.append(f"{indent}const int64_t i{d} = {q} % {cindex(shape[d])};" if d > 0 else
                     f"{indent}const int64_t i{d} = {q};")
        inner = inner * shape[d]
    return lines + [f"{indent}const int64_t i{r - 2} = {row};", f"{indent}const int64_t i{r - 1} = {col};"]


def supported(prog: ir.Program, k: Kernel) -> bool:
    """Whether the fused kernel takes ``k``: heads up to MAX_HEAD_DIM wide, and the scores' and the output's
    positions [batch dims..., rows, cols] (it binds them so)."""
    qk, pv = k.stages[0].node, k.stages[-1].node
    g1, g2 = qk.gemm, pv.gemm
    p_shape = k.stages[3].node.out.shape
    shapes = ((qk.out.shape, g1.n), (p_shape, g1.n), (pv.out.shape, g2.n))
    return int(g1.k) <= MAX_HEAD_DIM and int(g2.n) <= MAX_HEAD_DIM and all(
        matrix_shaped(shape, g1.m, cols) and ir.same_size(ir.product(shape[:-2]), g1.batch) for shape, cols in shapes)


def attention_body(prog: ir.Program, k: Kernel, names, indent: str) -> list[str]:
    """The statements of one program: batch·head ``o0``, query rows from ``o1 * BM``. C++ names the index
    text keeps (exporter/cpu/values.CIndex): r0 the first row, r1 the block's first key, q0 a row of the
    block, q1 a key, q2 a column. Both products of a block go through ``tc_sgemm_block`` (the own AVX-512
    kernel, else the BLAS) on blocks gathered as float32 (16-bit values widen there)."""
    qk, pv = k.stages[0].node, k.stages[-1].node
    g1, g2 = qk.gemm, pv.gemm
    d, dv = int(g1.k), int(g2.n)
    i1, i2, i3 = (indent + "  " * n for n in range(1, 4))
    neg_inf = "-std::numeric_limits<float>::infinity()"
    lines = [
        f"{indent}const int64_t M = {cindex(g1.m)}, N = {cindex(g1.n)};",
        f"{indent}const int64_t r0 = o1 * {BM}, mm = std::min<int64_t>({BM}, M - r0);",
        f"{indent}float* const q = tc_scratch({BM * d + 2 * BM * dv + BM * BN + BN * d + BN * dv});",
        f"{indent}float* const acc = q + {BM * d};",
        f"{indent}float* const pv = acc + {BM * dv};",
        f"{indent}float* const s = pv + {BM * dv};",
        f"{indent}float* const kb = s + {BM * BN};",
        f"{indent}float* const vb = kb + {BN * d};",
        f"{indent}float m_i[{BM}], l_i[{BM}], alpha[{BM}];",
        f"{indent}for (int64_t q0 = 0; q0 < mm; ++q0) {{",
        f"{i1}m_i[q0] = {neg_inf}; l_i[q0] = 0.0f;",
        f"{i1}for (int64_t q2 = 0; q2 < {dv}; ++q2) acc[q0 * {dv} + q2] = 0.0f;",
        f"{i1}for (int64_t q2 = 0; q2 < {d}; ++q2) q[q0 * {d} + q2] = {_element(prog, g1.a, 'o0', 'r0 + q0', 'q2')};",
        f"{indent}}}",
        f"{indent}for (int64_t r1 = 0; r1 < N; r1 += {BN}) {{",
        f"{i1}const int64_t nn = std::min<int64_t>({BN}, N - r1);",
    ]

    if skips_masked_keys(k):  # a block whose scores are -inf whatever q and k are: skipped before K is read
        lines += [f"{i1}bool live = false;",
                  f"{i1}for (int64_t q0 = 0; q0 < mm && !live; ++q0) {{",
                  f"{i2}for (int64_t q1 = 0; q1 < nn; ++q1) {{",
                  f"{i3}float tc_v;"]
        lines += _scores(prog, k, "0.0f", names, i3)
        lines += [f"{i3}live |= tc_v != {neg_inf};", f"{i2}}}", f"{i1}}}", f"{i1}if (!live) continue;"]
    lines += [
        f"{i1}for (int64_t q1 = 0; q1 < nn; ++q1)",
        f"{i2}for (int64_t q2 = 0; q2 < {d}; ++q2)",
        f"{i3}kb[q1 * {d} + q2] = {_element(prog, g1.b, 'o0', 'q2', 'r1 + q1')};",
        f"{i1}tc_sgemm_block(f.sgemm, mm, nn, {d}, q, {d}, true, kb, {d}, s, {BN});",
        f"{i1}for (int64_t q0 = 0; q0 < mm; ++q0) {{",
        f"{i2}float* si = s + q0 * {BN};",
        f"{i2}#pragma omp simd",
        f"{i2}for (int64_t q1 = 0; q1 < nn; ++q1) {{",
        f"{i3}float tc_v;",
    ]
    lines += _scores(prog, k, "si[q1]", names, i3)
    lines += [
        f"{i3}si[q1] = tc_v;",
        f"{i2}}}",
        f"{i2}float mx = {neg_inf};",
        f"{i2}#pragma omp simd reduction(max:mx)",
        f"{i2}for (int64_t q1 = 0; q1 < nn; ++q1) mx = std::max(mx, si[q1]);",
        f"{i2}const float m_new = std::max(m_i[q0], mx);",
        f"{i2}const float m_use = m_new == {neg_inf} ? 0.0f : m_new;",
        f"{i2}alpha[q0] = tc_exp(m_i[q0] - m_use);",
        f"{i2}float sum = 0.0f;",
        f"{i2}#pragma omp simd reduction(+:sum)",
        f"{i2}for (int64_t q1 = 0; q1 < nn; ++q1) {{ si[q1] = tc_exp(si[q1] - m_use); sum += si[q1]; }}",
        f"{i2}l_i[q0] = l_i[q0] * alpha[q0] + sum;",
        f"{i2}m_i[q0] = m_new;",
        f"{i1}}}",
        f"{i1}for (int64_t q1 = 0; q1 < nn; ++q1)",
        f"{i2}for (int64_t q2 = 0; q2 < {dv}; ++q2)",
        f"{i3}vb[q1 * {dv} + q2] = {_element(prog, g2.b, 'o0', 'r1 + q1', 'q2')};",
        f"{i1}tc_sgemm_block(f.sgemm, mm, {dv}, nn, s, {BN}, false, vb, {dv}, pv, {dv});",
        f"{i1}for (int64_t q0 = 0; q0 < mm; ++q0)",
        f"{i2}for (int64_t q2 = 0; q2 < {dv}; ++q2) acc[q0 * {dv} + q2] = acc[q0 * {dv} + q2] * alpha[q0] + "
        f"pv[q0 * {dv} + q2];",
        f"{indent}}}",
    ]
    return lines + _output(prog, k, names, indent)


def _scores(prog: ir.Program, k: Kernel, product: str, names, ind: str) -> list[str]:
    """A block setting ``tc_v`` to the softmax's input at (r0 + q0, r1 + q1), the product q·k being ``product``:
    the scores GEMM's epilogue (scale, mask), then what the softmax applied to it. Each index space binds
    i0, i1, ... in a block of its own."""
    qk = k.stages[0].node
    value, s_load = attention_scores(k)
    inner = ind + "  "
    out = [f"{ind}{{"] + _bind(qk.out.shape, "r0 + q0", "r1 + q1", inner)
    em = CppEmitter(prog, {qk.out.name: product}, inner, names)
    e = em.emit(qk.body) if qk.body is not None else product
    out += em.lines
    if value != s_load:
        deeper = inner + "  "
        em = CppEmitter(prog, {qk.out.name: e}, deeper, names)
        e = em.emit(value)
        out += [f"{inner}{{"] + _bind(k.stages[3].node.out.shape, "r0 + q0", "r1 + q1", deeper) + em.lines
        out += [f"{deeper}tc_v = {e};", f"{inner}}}"]
    else:
        out += [f"{inner}tc_v = {e};"]
    return out + [f"{ind}}}"]


def _output(prog: ir.Program, k: Kernel, names, indent: str) -> list[str]:
    """acc / l (a row with every key masked is 0/0, NaN, as the unfused softmax gives), stored through the PV
    GEMM's epilogue at b * M * DV + row * DV + col."""
    pv = k.stages[-1].node
    g1, g2 = k.stages[0].node.gemm, pv.gemm
    dv = int(g2.n)
    i1, i2, i3 = (indent + "  " * n for n in range(1, 4))
    r0, q0, q2, o0 = (sympy.Symbol(x, integer=True, nonnegative=True) for x in ("r0", "q0", "q2", "o0"))
    flat = o0 * g1.m * g2.n + (r0 + q0) * g2.n + q2
    lines = [f"{indent}for (int64_t q0 = 0; q0 < mm; ++q0) {{",
             f"{i1}for (int64_t q2 = 0; q2 < {dv}; ++q2) {{",
             f"{i2}const float o = acc[q0 * {dv} + q2] / l_i[q0];",
             f"{i2}{{"]
    val = "o"
    if pv.body is not None:
        em = CppEmitter(prog, {pv.out.name: "o"}, i3, names)
        val = em.emit(pv.body)
        lines += _bind(pv.out.shape, "r0 + q0", "q2", i3) + em.lines
    return lines + [f"{i3}{pv.out.name}[{cindex(flat)}] = {stored(pv.out.dtype, val)};",
                    f"{i2}}}", f"{i1}}}", f"{indent}}}"]
