"""Go/no-go probe (`python -m bench.probes.persistent_gemm` on a GPU machine): does a persistent GEMM, one
program per SM walking its tiles with the loop over tiles software-pipelined across tile boundaries
(``tl.range(..., flatten=True)``), beat our one-program-per-tile template on GPT-2 small's GEMMs at batch 8?

The LM head (1024 x 50257 x 768) has only 12 k-steps of 64 per 128x256 tile, so each tile's pipeline fill and
its 64 KB epilogue of unaligned stores (N=50257) are not hidden behind another tile's loads in the template,
which fits one such program per SM. cuBLAS takes 117 us there on a padded N, the template 176 us. Loads are
pointer loads or TMA descriptors (``tl.make_tensor_descriptor``); stores are pointer stores, since the output's
row stride (50257 elements) is not 16-byte aligned and TMA cannot write it. One program per tile is
``mm_tile`` (bench/probes/gemm_kernels.py), the template's loop, with a zero bias.

Results: bench/results/nvidia-h200-2026-11-30-persistent-lm-head.md."""
import torch
import triton
from triton.testing import do_bench

from bench.probes.common import parser, require_gpu, torch_allocator_for_triton
from bench.probes.gemm_kernels import mm_persist, mm_tile


TILE_CONFIGS = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 4, 3), (64, 128, 64, 4, 5)]
PERSIST_CONFIGS = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
                   (128, 128, 128, 8, 3), (128, 256, 128, 8, 2), (64, 128, 64, 4, 5), (64, 256, 64, 4, 4)]
SHAPES = {"head": (50257, 768), "qkv": (2304, 768), "fc1": (3072, 768), "fc2": (768, 3072), "proj": (768, 768)}


def compare():
    """Every shape: cuBLAS, the tile template and the persistent variants, each checked, the best of each kind."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    M = 1024
    for name, (N, K) in SHAPES.items():
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        zero = torch.zeros(N, device="cuda", dtype=torch.bfloat16)
        ref = (a.float() @ w.float().T)
        fl = 2 * M * N * K
        rows = [("cublas", None, do_bench(lambda: a @ w.T))]
        if name == "head":
            wp = torch.nn.functional.pad(w, (0, 0, 0, 50304 - N))
            rows.append(("cublas N=50304", None, do_bench(lambda: a @ wp.T)))
        runs = [("tile", cfg, None) for cfg in TILE_CONFIGS]
        runs += [(f"persist{'-flat' if flat else ''}{'-tma' if tma else ''}", cfg, (flat, tma))
                 for cfg in PERSIST_CONFIGS for flat in (False, True) for tma in (False, True)]
        for kind, (bm, bn, bk, warps, stages), opts in runs:
            tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
            if opts is None:  # the weight is [N, K]: WT; the bias is zero
                def call():
                    mm_tile[(tiles,)](a, w, c, zero, M, N, K, bm, bn, bk, 8, WT=True, num_warps=warps,
                                      num_stages=stages)
            else:
                def call():
                    mm_persist[(min(sms, tiles),)](a, w, c, M, N, K, bm, bn, bk, 8, sms, opts[0], opts[1],
                                                   num_warps=warps, num_stages=stages)
            try:
                c.zero_()
                call()
                torch.testing.assert_close(c.float(), ref, rtol=2e-2, atol=2e-1)
                rows.append((kind, (bm, bn, bk, warps, stages), do_bench(call)))
            except Exception as e:  # noqa: BLE001 - a config the compiler rejects is reported, not fatal
                print(f"{name} {kind} {(bm, bn, bk, warps, stages)} failed: {str(e).splitlines()[0][:160]}")
        best = {}
        for kind, cfg, t in rows:
            if kind not in best or t < best[kind][1]:
                best[kind] = (cfg, t)
        print(f"== M={M} {name} N={N} K={K}", flush=True)
        for kind, (cfg, t) in sorted(best.items(), key=lambda r: r[1][1]):
            print(f"  {kind:20s} {t * 1e3:7.1f} us {fl / t / 1e9:5.0f} TF/s {cfg or ''}", flush=True)
        if name == "head":
            for kind, cfg, t in rows:
                print(f"    {kind:20s} {cfg} {t * 1e3:7.1f} us", flush=True)


def main(argv=None):
    parser(__doc__).parse_args(argv)
    require_gpu()
    torch_allocator_for_triton()  # the TMA variants' descriptors
    compare()


if __name__ == "__main__":
    main()
