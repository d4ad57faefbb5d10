"""Probe: layer norm folded into the GEMM that reads it (GPT-2's ln_1 -> QKV, ln_2 -> fc1), against a separate LN
kernel + the plain GEMM. The fused kernel computes each row block's mean and rstd in a first pass over K, then
normalises every A tile in registers before the dot. M = 1024 (batch 8) and 128 (batch 1), bf16,
triton.testing.do_bench. It lost: 29.5 against 17.6 us (H200).

    python -m bench.probes.ln_gemm                                  # on a GPU machine
    TRITON_INTERPRET=1 python -m bench.probes.ln_gemm --check       # correctness on the CPU, small shapes

Results: bench/results/nvidia-h200-2026-11-30-gpt2-b8-kernels.md."""
import torch
import triton
import triton.language as tl

from bench.probes.common import Mode, add_check_option, parser, run_mode
from bench.probes.gemm_kernels import tile_pid


@triton.jit
def ln_rows(X, G, Bt, Y, M, K: tl.constexpr, KP: tl.constexpr, XB: tl.constexpr, EPS: tl.constexpr):
    rows = tl.program_id(0) * XB + tl.arange(0, XB)[:, None]
    cols = tl.arange(0, KP)[None, :]
    x = tl.load(X + rows * K + cols, mask=(rows < M) & (cols < K), other=0.0).to(tl.float32)
    mean = tl.sum(x, 1, keep_dims=True) / K
    d = tl.where(cols < K, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, 1, keep_dims=True) / K + EPS)
    y = d * rstd * tl.load(G + cols, mask=cols < K).to(tl.float32) + tl.load(Bt + cols, mask=cols < K).to(tl.float32)
    tl.store(Y + rows * K + cols, y.to(Y.dtype.element_ty), mask=(rows < M) & (cols < K))


@triton.jit
def mm(A, W, C, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
       GROUP_M: tl.constexpr, LN: tl.constexpr, G, Bt, EPS: tl.constexpr):
    pid_m, pid_n = tile_pid(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN); rk = tl.arange(0, BK)
    if LN:  # first pass: the rows' mean and rstd (the block's rows, all of K, from L2)
        s1 = tl.zeros((BM,), tl.float32); s2 = tl.zeros((BM,), tl.float32)
        for kk in range(0, tl.cdiv(K, BK)):
            a = tl.load(A + rm[:, None] * K + kk * BK + rk[None, :], mask=rm[:, None] < M, other=0.0).to(tl.float32)
            s1 += tl.sum(a, 1); s2 += tl.sum(a * a, 1)
        mean = s1 / K
        rstd = 1.0 / tl.sqrt(tl.maximum(s2 / K - mean * mean, 0.0) + EPS)
    acc = tl.zeros((BM, BN), tl.float32)
    for kk in range(0, tl.cdiv(K, BK)):
        a = tl.load(A + rm[:, None] * K + kk * BK + rk[None, :], mask=rm[:, None] < M, other=0.0)
        if LN:
            g = tl.load(G + kk * BK + rk).to(tl.float32); bt = tl.load(Bt + kk * BK + rk).to(tl.float32)
            a = ((a.to(tl.float32) - mean[:, None]) * rstd[:, None] * g[None, :] + bt[None, :]).to(A.dtype.element_ty)
        b = tl.load(W + (kk * BK + rk[:, None]) * N + rn[None, :], mask=rn[None, :] < N, other=0.0)
        acc = tl.dot(a, b, acc)
    acc += tl.load(bias + rn, mask=rn < N).to(tl.float32)[None, :]
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def run(M, N, K, cfg, x, g, bt, w, bias, fused):
    """(a call of the fused kernel, or of the LN kernel then the GEMM; its output), like ``x``."""
    bm, bn, bk, warps, stages = cfg
    c = torch.empty(M, N, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    if fused:
        return lambda: mm[grid](x, w, c, bias, M, N, K, bm, bn, bk, 8, True, g, bt, 1e-5, num_warps=warps,
                                num_stages=stages), c
    y = torch.empty(M, K, device=x.device, dtype=x.dtype)
    def both():
        ln_rows[(triton.cdiv(M, 4),)](x, g, bt, y, M, K, triton.next_power_of_2(K), 4, 1e-5, num_warps=4)
        mm[grid](y, w, c, bias, M, N, K, bm, bn, bk, 8, False, g, bt, 1e-5, num_warps=warps, num_stages=stages)
    return both, c


SHAPES = {"qkv": (2304, 768), "fc1": (3072, 768)}
CONFIGS = [(64, 128, 64, 4, 3), (64, 64, 128, 4, 3), (128, 128, 64, 8, 3), (64, 128, 128, 4, 3)]
CHECK_SHAPES, CHECK_CONFIGS = {"small": (96, 128)}, [(32, 32, 64, 4, 2)]


def compare(mode: Mode):
    """Separate against fused at every shape, each config checked against torch, the best one timed."""
    from triton.testing import do_bench

    CHECK, DEV, DT = mode.check, mode.device, mode.dtype
    shapes, configs = (CHECK_SHAPES, CHECK_CONFIGS) if CHECK else (SHAPES, CONFIGS)
    for M in ((40,) if CHECK else (1024, 128)):
        for name, (N, K) in shapes.items():
            x = torch.randn(M, K, device=DEV, dtype=DT) * 3 + 1
            g = torch.randn(K, device=DEV, dtype=DT); bt = torch.randn(K, device=DEV, dtype=DT)
            w = torch.randn(K, N, device=DEV, dtype=DT) * 0.05; bias = torch.randn(N, device=DEV, dtype=DT)
            ref = torch.addmm(bias.float(), torch.nn.functional.layer_norm(x.float(), (K,), g.float(), bt.float()), w.float())
            line = f"M={M} {name}:"
            for fused in (False, True):
                best = None
                for cfg in configs:
                    fn, c = run(M, N, K, cfg, x, g, bt, w, bias, fused)
                    fn()
                    err = ((c.float() - ref).norm() / ref.norm()).item()
                    assert err < 2e-2, (name, cfg, fused, err)
                    if CHECK:
                        print(name, "fused" if fused else "separate", "rel err", round(err, 5)); continue
                    t = do_bench(fn)
                    best = min(best or (t, cfg), (t, cfg))
                if best:
                    line += f" | {'LN in GEMM' if fused else 'LN kernel + GEMM'} {best[0]*1e3:6.1f} us {best[1]}"
            print(line, flush=True)


def main(argv=None):
    p = parser(__doc__)
    add_check_option(p)
    compare(run_mode(p.parse_args(argv)))


if __name__ == "__main__":
    main()
