"""Probe: what GPT-2's GEMM epilogues cost at batch 8 (M=1024, bf16, 64x128x64 and 64x64x128 tiles), timed in a
CUDA graph of 12 launches with 12 weights. Variants: the bias as a [BN] row vs the generated code's full-tile load
with indices decomposed per element (division by the runtime seq length); GELU (tanh form) with libdevice.tanh,
tanh.approx.f32, and exp; the residual add indexed per element vs per row.

    python -m bench.probes.epilogue                                 # on a GPU machine
    TRITON_INTERPRET=1 python -m bench.probes.epilogue --check      # correctness on the CPU, small shapes

Results: bench/results/nvidia-h200-2026-11-30-gpt2-b8-kernels.md."""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from bench.probes.common import Mode, add_check_option, graph_us, parser, run_mode
from bench.probes.gemm_kernels import tile_pid


@triton.jit
def _tanh_approx(x):
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def mm_epi(A, W, C, bias, R, M, N, K, seq, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
           GROUP_M: tl.constexpr, ROWS: tl.constexpr, GELU: tl.constexpr, RES: tl.constexpr):
    pid_m, pid_n = tile_pid(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN); rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for kk in range(0, tl.cdiv(K, BK)):
        a = tl.load(A + rm[:, None] * K + kk * BK + rk[None, :], mask=rm[:, None] < M, other=0.0)
        b = tl.load(W + (kk * BK + rk[:, None]) * N + rn[None, :])
        acc = tl.dot(a, b, acc)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if ROWS:  # i0, i1 from the row, i2 from the column: bias loads [1, BN]
        i2 = rn[None, :]
        i1 = rm[:, None] % seq
        i0 = rm[:, None] // seq
        t0 = tl.load(bias + i2, mask=rn[None, :] < N, other=0).to(tl.float32)
    else:  # as generated today: every index from the flat position, every load full-tile
        flat_e = rm[:, None] * N + rn[None, :]
        i2 = flat_e % N
        i1 = (flat_e // N) % seq
        i0 = flat_e // (N * seq)
        t0 = tl.load(bias + i2, mask=mask, other=0).to(tl.float32)
    t1 = acc + t0
    if GELU > 0:
        y = (t1 + t1 * t1 * t1 * 0.044715) * 0.7978845608028654
        if GELU == 1:
            t = libdevice.tanh(y)
        elif GELU == 2:
            t = _tanh_approx(y)
        else:
            t = 1.0 - 2.0 / (1.0 + tl.exp(2.0 * y))
        t1 = t1 * 0.5 * (t + 1.0)
    if RES:
        t1 += tl.load(R + i2 + N * i1 + N * seq * i0, mask=mask, other=0).to(tl.float32)
    tl.store(C + rm[:, None] * N + rn[None, :], t1.to(C.dtype.element_ty), mask=mask)


def epilogues(mode: Mode):
    """Each GEMM shape with the epilogues its layer has, indices per element and per row, checked against torch."""
    CHECK, DEV, DT = mode.check, mode.device, mode.dtype
    seq = 128 if not CHECK else 16
    shapes = {"small": (48, 64, 96, (32, 32, 32, 4, 2))} if CHECK else {
        "fc1": (1024, 3072, 768, (64, 128, 64, 4, 3)), "proj": (1024, 768, 768, (64, 64, 128, 4, 3)),
        "fc2": (1024, 768, 3072, (64, 64, 128, 4, 3)), "qkv": (1024, 2304, 768, (64, 128, 64, 4, 3))}
    layers = 2 if CHECK else 12
    for name, (M, N, K, (bm, bn, bk, warps, stages)) in shapes.items():
        a = torch.randn(M, K, device=DEV, dtype=DT)
        ws = [torch.randn(K, N, device=DEV, dtype=DT) * 0.05 for _ in range(layers)]
        bias = torch.randn(N, device=DEV, dtype=DT)
        r = torch.randn(M, N, device=DEV, dtype=DT)
        cs = [torch.empty(M, N, device=DEV, dtype=DT) for _ in range(layers)]
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        line = f"{name} M={M} N={N} K={K} {bm}x{bn}x{bk}:"
        variants = [("bias", 0, 0)] + ([("gelu libdevice", 1, 0), ("gelu approx", 2, 0), ("gelu exp", 3, 0)]
                                       if name in ("fc1", "small") else []) + \
            ([("bias+res", 0, 1)] if name in ("proj", "fc2", "small") else [])
        for label, gelu, res in variants:
            if CHECK and gelu in (1, 2):  # inline asm and libdevice do not run in the interpreter
                continue
            for rows in (False, True):
                fns = [lambda w=w, c=c: mm_epi[grid](a, w, c, bias, r, M, N, K, seq, bm, bn, bk, 8, rows, gelu, res,
                                                     num_warps=warps, num_stages=stages) for w, c in zip(ws, cs)]
                for f in fns:
                    f()
                ref = torch.addmm(bias.float(), a.float(), ws[-1].float())
                if gelu:
                    ref = torch.nn.functional.gelu(ref, approximate="tanh")
                if res:
                    ref = ref + r.float()
                err = ((cs[-1].float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (name, label, rows, err)
                t = float("nan") if CHECK else graph_us(fns)
                line += f" | {label}{' rows' if rows else ''} {t:.2f} us err {err:.1e}"
        print(line, flush=True)


def main(argv=None):
    p = parser(__doc__)
    add_check_option(p)
    epilogues(run_mode(p.parse_args(argv)))


if __name__ == "__main__":
    main()
