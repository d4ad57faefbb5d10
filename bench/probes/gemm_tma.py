"""Go/no-go probe (`python -m bench.probes.gemm_tma` on a GPU machine): pointer loads (our template) vs TMA
descriptor loads (tl.make_tensor_descriptor) vs cuBLAS on GPT-2 small's GEMM shapes at batch 8 (M=1024) and
batch 1 (M=128), bf16, linear layers with bias, timed with triton.testing.do_bench.

Results: bench/results/nvidia-h200-2026-11-29-gemm-probe.md."""
import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from bench.probes.common import parser, require_gpu, torch_allocator_for_triton


@triton.jit
def _pid(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % group) % group_m, (pid % group) // group_m


@triton.jit
def mm_ptr(A, W, C, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _pid(M, N, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for kk in range(0, tl.cdiv(K, BK)):
        a = tl.load(A + rm[:, None] * K + kk * BK + rk[None, :], mask=rm[:, None] < M, other=0.0)
        b = tl.load(W + rn[None, :] * K + kk * BK + rk[:, None], mask=rn[None, :] < N, other=0.0)
        acc = tl.dot(a, b, acc)
    acc += tl.load(bias + rn, mask=rn < N).to(tl.float32)[None, :]
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def mm_tma(A, W, C, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _pid(M, N, BM, BN, GROUP_M)
    a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    w_desc = tl.make_tensor_descriptor(W, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    acc = tl.zeros((BM, BN), tl.float32)
    for kk in range(0, tl.cdiv(K, BK)):
        a = a_desc.load([pid_m * BM, kk * BK])
        b = w_desc.load([pid_n * BN, kk * BK])
        acc = tl.dot(a, b.T, acc)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    acc += tl.load(bias + rn, mask=rn < N).to(tl.float32)[None, :]
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


CONFIGS = [(64, 64, 128, 4, 3), (64, 128, 64, 4, 3), (64, 128, 64, 4, 4), (128, 128, 64, 4, 3), (128, 128, 64, 8, 3),
           (128, 256, 64, 8, 3), (128, 64, 64, 4, 3), (64, 256, 64, 4, 3), (128, 128, 64, 8, 4)]
SHAPES = {"qkv": (2304, 768), "proj": (768, 768), "fc1": (3072, 768), "fc2": (768, 3072), "head": (50257, 768)}


def compare():
    """Every shape at both batches: cuBLAS and the best config of each kernel, each checked against torch."""
    for M in (1024, 128):
        for name, (N, K) in SHAPES.items():
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
            bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
            c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(a, w, bias)
            cublas = do_bench(lambda: torch.nn.functional.linear(a, w, bias))
            best = {}
            for kern in (mm_ptr, mm_tma):
                for bm, bn, bk, warps, stages in CONFIGS:
                    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
                    try:
                        kern[grid](a, w, c, bias, M, N, K, bm, bn, bk, 8, num_warps=warps, num_stages=stages)
                        torch.testing.assert_close(c.float(), ref.float(), rtol=2e-2, atol=2e-1)
                        t = do_bench(lambda: kern[grid](a, w, c, bias, M, N, K, bm, bn, bk, 8, num_warps=warps,
                                                        num_stages=stages))
                    except Exception as e:  # noqa: BLE001
                        print(kern.__name__, (bm, bn, bk, warps, stages), "failed", str(e)[:200])
                        continue
                    if kern.__name__ not in best or t < best[kern.__name__][0]:
                        best[kern.__name__] = (t, (bm, bn, bk, warps, stages))
            fl = 2 * M * N * K
            print(f"M={M} {name:5s} cublas {cublas*1e3:6.1f} us ({fl/cublas/1e9:4.0f} TF) | " + " | ".join(
                f"{k} {t*1e3:6.1f} us ({fl/t/1e9:4.0f} TF) {cfg}" for k, (t, cfg) in best.items()), flush=True)


def main(argv=None):
    parser(__doc__).parse_args(argv)
    require_gpu()
    torch_allocator_for_triton()  # mm_tma's descriptors
    compare()


if __name__ == "__main__":
    main()
