"""Probe: a decode step's GEMMs (1 or 8 rows) over tile shapes and split-K, to choose the tiles of the GEMM band for
a few rows. GPT-2 small's (weights [K, N], Conv1D) and a ~1B Llama's (weights [N, K], Linear) projections, each
timed as the model sees it: a CUDA graph of ``--layers`` launches, each with its own weight (cold in L2). Split-K
is the exporter's two kernels (schedule/split_k.py): a batched GEMM writing float32 slices, then a kernel that sums
them in order and adds the bias. Printed per shape: cuBLAS, the tiles the exporter picks (marked), and the best
configs, each with its weight bandwidth (GB/s) and its program count.

    python -m bench.probes.decode_gemm [--rows 1 8] [--layers 8]       # on a GPU machine
    TRITON_INTERPRET=1 python -m bench.probes.decode_gemm --check     # correctness on the CPU, small shapes

Results: bench/results/nvidia-h100-2026-12-06-decode-gemm.md, bench/results/nvidia-h100-2026-12-07-gemm-table.md
(`--layout kn`)."""
import itertools

import torch
import triton
import triton.language as tl

from bench.probes.common import add_check_option, graph_us, parser, run_mode


@triton.jit
def mm_slices(A, W, P, bias, M, N, K, KS, S: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, WT: tl.constexpr):
    """Slice ``program_id(1)`` of K (KS long): its partial product to P[s] in float32, or, with one slice, the
    product plus bias to P in P's type. W is [K, N], or [N, K] with WT."""
    pid_m = tl.program_id(0) % tl.cdiv(M, BM)
    pid_n = tl.program_id(0) // tl.cdiv(M, BM)
    s = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for kk in range(0, tl.cdiv(KS, BK)):
        k = s * KS + kk * BK + rk
        a = tl.load(A + rm[:, None] * K + k[None, :], mask=rm[:, None] < M, other=0.0)
        if WT:
            b = tl.load(W + rn[None, :] * K + k[:, None], mask=rn[None, :] < N, other=0.0)
        else:
            b = tl.load(W + k[:, None] * N + rn[None, :], mask=rn[None, :] < N, other=0.0)
        acc = tl.dot(a, b, acc)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if S == 1:
        acc += tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(P + rm[:, None] * N + rn[None, :], acc.to(P.dtype.element_ty), mask=mask)
    else:
        tl.store(P + s * M * N + rm[:, None] * N + rn[None, :], acc, mask=mask)


@triton.jit
def sum_slices(P, bias, C, M, N, S: tl.constexpr, XBLOCK: tl.constexpr):
    """C = P[0] + ... + P[S-1] + bias, in order (the exporter's reduce kernel)."""
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = x < M * N
    acc = tl.load(P + x, mask=mask, other=0.0)
    for s in tl.static_range(1, S):
        acc += tl.load(P + s * M * N + x, mask=mask, other=0.0)
    acc += tl.load(bias + x % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(C + x, acc.to(C.dtype.element_ty), mask=mask)


SHAPES = {  # name: (N, K, weight stored [N, K]); GPT-2's LM head is tied to the embedding, so [N, K] too
    "gpt2 qkv": (2304, 768, False), "gpt2 proj": (768, 768, False), "gpt2 fc1": (3072, 768, False),
    "gpt2 fc2": (768, 3072, False), "gpt2 head": (50257, 768, True),
    "llama q/o": (2048, 2048, True), "llama k/v": (512, 2048, True), "llama gate/up": (8192, 2048, True),
    "llama down": (2048, 8192, True), "llama head": (32000, 2048, True),
}
CHECK_SHAPES = {"small": (96, 512, False), "small wt": (80, 256, True)}


def exporter(n: int, k: int, wt: bool):
    """The tiles and slices the exporter gives this GEMM at a few rows (cuda/tiles.py's FEW_TILE, split_k.py's
    few_slices)."""
    from tcexport.exporter.cuda.tiles import gemm_config
    from tcexport.exporter.schedule.small_m import FEW_M
    from tcexport.exporter.schedule.split_k import few_slices

    s = few_slices(n, k)
    cfg = gemm_config("bfloat16", FEW_M, n, k // s, b_nk=wt, batch=s)
    return cfg.bm, cfg.bn, cfg.bk, s, cfg.num_warps, cfg.num_stages


def launcher(a, w, c, part, bias, M, N, K, cfg, wt):
    bm, bn, bk, s, warps, stages = cfg
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), s)
    xblock = 1024

    def f():
        mm_slices[grid](a, w, c if s == 1 else part, bias, M, N, K, K // s, s, bm, bn, bk, wt, num_warps=warps,
                        num_stages=stages)
        if s > 1:
            sum_slices[(triton.cdiv(M * N, xblock),)](part, bias, c, M, N, s, xblock, num_warps=4)
    return f, grid[0] * grid[1]


def configs(k: int, check: bool):
    if check:
        yield from ((16, 32, 64, s, 4, 2) for s in (1, 2, 4))
        return
    for bn, bk, s, warps, stages in itertools.product((16, 32, 64, 128), (64, 128, 256), (1, 2, 4, 8, 16),
                                                      (2, 4), (3, 5)):
        if k % (s * bk) == 0 and (warps == 2) == (bn <= 32):
            yield 16, bn, bk, s, warps, stages


def main(argv=None):
    p = parser(__doc__)
    add_check_option(p)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    p.add_argument("--layers", type=int, default=8, help="launches a graph holds, each with its own weight")
    p.add_argument("--shapes", nargs="+", default=None, help="names from SHAPES (default: all)")
    p.add_argument("--layout", choices=("model", "kn", "nk"), default="model",
                   help="each weight as its model stores it, or every one [K, N] (what a package stores a linear's "
                        "weight as for a GPU, front/weights_kn.py) or [N, K]")
    args = p.parse_args(argv)
    mode = run_mode(args)
    dev, dt = mode.device, mode.dtype
    shapes = CHECK_SHAPES if args.check else {k: v for k, v in SHAPES.items() if not args.shapes or k in args.shapes}
    for (name, (N, K, wt)), M in itertools.product(shapes.items(), args.rows):
        wt = wt if args.layout == "model" else args.layout == "nk"
        layers = 2 if args.check else (args.layers if N * K < 2 ** 26 else 2)
        a = torch.randn(M, K, device=dev, dtype=dt)
        ws = [torch.randn(*((N, K) if wt else (K, N)), device=dev, dtype=dt) * 0.05 for _ in range(layers)]
        bias = torch.randn(N, device=dev, dtype=dt)
        cs = [torch.empty(M, N, device=dev, dtype=dt) for _ in range(layers)]
        part = torch.empty(16 * M * N, device=dev, dtype=torch.float32)
        refs = [a.float() @ (w.float().t() if wt else w.float()) + bias.float() for w in ws]
        gbs = lambda us: N * K * 2 / us / 1e3  # noqa: E731 - weight bytes over time, GB/s
        res = []
        cands = list(configs(K, args.check))
        if not args.check:
            cands.append(exporter(N, K, wt))
        for cfg in cands:
            fns, programs = zip(*(launcher(a, w, c, part, bias, M, N, K, cfg, wt) for w, c in zip(ws, cs)))
            try:
                for c in cs:
                    c.fill_(float("nan"))
                for f in fns:
                    f()
            except triton.runtime.errors.OutOfResources:
                continue
            for c, r in zip(cs, refs):
                err = ((c.float() - r).norm() / r.norm()).item()
                assert err < 2e-2, (name, M, cfg, err)
            mine = not args.check and cfg == exporter(N, K, wt)
            label = "{}x{}x{} S{} w{} s{}".format(*cfg) + (" (exporter)" if mine else "")
            res.append((0.0 if args.check else graph_us(list(fns)), label, programs[0]))
        if args.check:
            print(f"{name} M={M}: {len(res)} configs ok", flush=True)
            continue
        lin = [lambda w=w, c=c: torch.nn.functional.linear(a, w, bias, out=c) if wt else
               torch.addmm(bias, a, w, out=c) for w, c in zip(ws, cs)]
        cub = graph_us(lin)
        res.sort()
        layout = "[N,K]" if wt else "[K,N]"
        print(f"{name} M={M} N={N} K={K} {layout}: cuBLAS {cub:.2f} us ({gbs(cub):.0f} GB/s)", flush=True)
        for t, label, programs in res[:6] + [r for r in res if "exporter" in r[1]]:
            print(f"  {t:7.2f} us {gbs(t):5.0f} GB/s {programs:5d} programs  {label}", flush=True)


if __name__ == "__main__":
    main()
