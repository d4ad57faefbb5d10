"""Probe: stream-K and serial split-K (one launch, fix-up by the last program to arrive) against the tile GEMM and
cuBLAS, on GPT-2 small's batch-8 GEMMs, and the LM head's tiles. Timed as the model sees them: a CUDA graph of 12
launches, each with its own weight (cold in L2) and one shared A (hot). `--fc2`: the down-projection only, over
more tiles; `--sweep`: tiles x warps x stages for the down-projection and the attention projection; `--sweep-wide`:
the same for the QKV projection, the MLP up-projection and the LM head.

    python -m bench.probes.split_k [--fc2 | --sweep | --sweep-wide]      # on a GPU machine
    TRITON_INTERPRET=1 python -m bench.probes.split_k --check             # correctness on the CPU, small shapes

Results: bench/results/nvidia-h200-2026-11-30-gpt2-b8-kernels.md."""
import torch
import triton
import triton.language as tl

from bench.probes.common import Mode, add_check_option, graph_us, parser, run_mode
from bench.probes.gemm_kernels import mm_tile, tile_pid


@triton.jit
def _k_steps(A, W, acc, rm, rn, rk, k0, k1, M, N, K, BK: tl.constexpr):
    """acc plus A[rm, k] @ W[k, rn] over k-steps k0..k1 (weights [K, N]), edges masked."""
    for kk in range(k0, k1):
        a = tl.load(A + rm[:, None] * K + kk * BK + rk[None, :], mask=rm[:, None] < M, other=0.0)
        b = tl.load(W + (kk * BK + rk[:, None]) * N + rn[None, :], mask=rn[None, :] < N, other=0.0)
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def mm_streamk(A, W, C, bias, WS, CNT, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               GROUP_M: tl.constexpr):
    """Each program takes an equal share of all (tile, k-step) iterations. A tile split between programs is summed
    in WS (float32, zero at rest) by atomics; the program whose k-steps complete the tile's count (CNT, zero at
    rest) applies the epilogue and puts WS and CNT back to zero."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    num_m = tl.cdiv(M, BM); num_n = tl.cdiv(N, BN); iters = tl.cdiv(K, BK)
    total = num_m * num_n * iters
    it = pid * total // G
    end = (pid + 1) * total // G
    rk = tl.arange(0, BK)
    while it < end:
        tile = it // iters
        k0 = it - tile * iters
        k1 = tl.minimum(iters, end - tile * iters)
        pid_m, pid_n = tile_pid(tile, num_m, num_n, GROUP_M)
        rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN)
        acc = _k_steps(A, W, tl.zeros((BM, BN), tl.float32), rm, rn, rk, k0, k1, M, N, K, BK)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        ws = WS + rm[:, None] * N + rn[None, :]
        done = True
        if k1 - k0 < iters:
            tl.atomic_add(ws, acc, mask=mask, sem="relaxed")
            tl.debug_barrier()
            done = tl.atomic_add(CNT + tile, k1 - k0, sem="acq_rel") + (k1 - k0) == iters
            if done:
                acc = tl.load(ws, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(ws, tl.zeros((BM, BN), tl.float32), mask=mask)
                tl.atomic_xchg(CNT + tile, 0)
        if done:
            out = acc + tl.load(bias + rn, mask=rn < N).to(tl.float32)[None, :]
            tl.store(C + rm[:, None] * N + rn[None, :], out.to(C.dtype.element_ty), mask=mask)
        it = tile * iters + k1


@triton.jit
def mm_serial(A, W, C, bias, WS, CNT, M, N, K, S: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, GROUP_M: tl.constexpr):
    """Split-K by S in one launch: slice s writes its partial to slot s of WS (no zeroing needed); the last of a
    tile's S programs to arrive (CNT, zero at rest) sums the others' slots with its own and stores."""
    pid = tl.program_id(0) // S
    s = tl.program_id(0) % S
    num_m = tl.cdiv(M, BM); num_n = tl.cdiv(N, BN); iters = tl.cdiv(K, BK)
    pid_m, pid_n = tile_pid(pid, num_m, num_n, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN); rk = tl.arange(0, BK)
    k0 = s * iters // S
    k1 = (s + 1) * iters // S
    acc = _k_steps(A, W, tl.zeros((BM, BN), tl.float32), rm, rn, rk, k0, k1, M, N, K, BK)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(WS + s * M * N + rm[:, None] * N + rn[None, :], acc, mask=mask)
    tl.debug_barrier()
    if tl.atomic_add(CNT + pid, 1, sem="acq_rel") == S - 1:
        for o in tl.static_range(S):
            if o != s:
                acc += tl.load(WS + o * M * N + rm[:, None] * N + rn[None, :], mask=mask, other=0.0,
                               cache_modifier=".cg")
        tl.atomic_xchg(CNT + pid, 0)
        acc += tl.load(bias + rn, mask=rn < N).to(tl.float32)[None, :]
        tl.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype.element_ty), mask=mask)


def head(mode: Mode):
    """The LM head (GPT-2's tied [N, K] embedding): masked tiles against wrapped loads, and tile shapes."""
    CHECK, DEV, DT = mode.check, mode.device, mode.dtype
    M, K = (64, 96) if CHECK else (1024, 768)
    for N in ((200,) if CHECK else (50257, 50304)):
        a = torch.randn(M, K, device=DEV, dtype=DT)
        w = torch.randn(N, K, device=DEV, dtype=DT) * 0.05
        bias = torch.zeros(N, device=DEV, dtype=DT)
        c = torch.empty(M, N, device=DEV, dtype=DT)
        ref = a.float() @ w.float().t()
        res = []
        cfgs = ((32, 32, 32, 4, 2, 8),) if CHECK else ((128, 256, 64, 8, 3, 8), (128, 256, 64, 8, 4, 8),
            (256, 128, 64, 8, 3, 8), (128, 256, 64, 8, 3, 16), (128, 128, 64, 4, 4, 8), (128, 256, 32, 8, 5, 8))
        for bm, bn, bk, warps, stages, gm in cfgs:
            for mod in (False, True):
                grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
                f = lambda: mm_tile[grid](a, w, c, bias, M, N, K, bm, bn, bk, gm, mod, True, num_warps=warps,
                                          num_stages=stages)
                c.fill_(float("nan")); f()
                err = ((c.float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (N, bm, bn, mod, err)
                if not CHECK:
                    res.append((graph_us([f] * 4), f"{bm}x{bn}x{bk} w{warps} s{stages} g{gm}" + (" wrapped" if mod else "")))
        if not CHECK:
            res.sort()
            print(f"head N={N}: " + "; ".join(f"{t:.1f} us {l}" for t, l in res[:6]), flush=True)
            print(f"  cublas {graph_us([lambda: torch.nn.functional.linear(a, w, out=c)] * 4):.1f} us", flush=True)
        else:
            print("head ok")


def gemms(mode: Mode, fc2: bool):
    """GPT-2's batch-8 GEMMs (``fc2``: the down-projection only): cuBLAS, the tile GEMM masked and wrapped, stream-K
    and serial split-K, each checked twice (the zero-at-rest workspace must hold for the next call)."""
    CHECK, DEV, DT = mode.check, mode.device, mode.dtype
    sms = 8 if CHECK else torch.cuda.get_device_properties(0).multi_processor_count
    shapes = {"small": (200, 96, 320)} if CHECK else \
        {"fc2": (1024, 768, 3072), "proj": (1024, 768, 768), "qkv": (1024, 2304, 768), "fc1": (1024, 3072, 768)}
    layers = 2 if CHECK else 12
    if fc2:
        shapes = {"fc2": shapes["fc2"]} if not CHECK else shapes
    else:
        head(mode)
    for name, (M, N, K) in shapes.items():
        a = torch.randn(M, K, device=DEV, dtype=DT)
        ws_ = [torch.randn(K, N, device=DEV, dtype=DT) * 0.05 for _ in range(layers)]
        bias = torch.randn(N, device=DEV, dtype=DT)
        cs = [torch.empty(M, N, device=DEV, dtype=DT) for _ in range(layers)]
        refs = [torch.addmm(bias.float(), a.float(), w.float()) for w in ws_]
        ws32 = torch.zeros(M * N, device=DEV, dtype=torch.float32)  # stream-K's: zero at rest
        slots = torch.empty(4 * M * N, device=DEV, dtype=torch.float32)  # serial split-K's
        cnt = torch.zeros(4096, device=DEV, dtype=torch.int32)
        res = []

        def check(label):
            for c, r in zip(cs, refs):
                err = ((c.float() - r).norm() / r.norm()).item()
                assert err < 1e-2, (name, label, err)
            if CHECK:
                print(name, label, "ok")

        def add(label, fns):
            for c in cs:
                c.fill_(float("nan"))
            for f in fns:
                f()
            check(label)
            for f in fns:  # twice: the zero-at-rest state must hold for the next call
                f()
            check(label)
            assert ws32.abs().max().item() == 0 and cnt.abs().max().item() == 0, (name, label)
            if not CHECK:
                res.append((graph_us(fns), label))

        if not CHECK:
            add("cublas", [lambda w=w, c=c: torch.addmm(bias, a, w, out=c) for w, c in zip(ws_, cs)])
        tiles = ((32, 32, 32, 4, 2),) if CHECK else \
            ((64, 64, 128, 4, 3), (64, 128, 64, 4, 3), (128, 64, 64, 4, 3), (128, 128, 64, 8, 3), (128, 64, 64, 4, 4))
        if fc2 and not CHECK:
            tiles = ((64, 32, 128, 4, 3), (64, 32, 64, 4, 4), (64, 64, 64, 4, 4), (64, 64, 64, 4, 3), (64, 64, 128, 4, 2),
                     (64, 64, 128, 4, 3), (64, 64, 256, 4, 2), (32, 64, 128, 4, 3))
        for bm, bn, bk, warps, stages in tiles:
            grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
            for mod in (False, True):
                add(f"tile {bm}x{bn}x{bk} w{warps} s{stages}" + (" wrapped" if mod else ""),
                    [lambda w=w, c=c: mm_tile[grid](a, w, c, bias, M, N, K, bm, bn, bk, 8, mod, num_warps=warps,
                                                    num_stages=stages) for w, c in zip(ws_, cs)])
        sk = ((32, 32, 32, 4, 2),) if CHECK else ((64, 64, 128, 4, 3), (64, 64, 64, 4, 4), (64, 128, 64, 4, 3)) \
            if fc2 else \
            ((128, 128, 64, 8, 3), (128, 128, 64, 4, 3), (128, 64, 64, 4, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 3),
             (128, 256, 64, 8, 3))
        for bm, bn, bk, warps, stages in sk:
            for g in ((sms,) if CHECK else (sms, 2 * sms, 3 * sms)):
                add(f"stream-K {bm}x{bn}x{bk} w{warps} s{stages} G={g}",
                    [lambda w=w, c=c: mm_streamk[(g,)](a, w, c, bias, ws32, cnt, M, N, K, bm, bn, bk, 8, num_warps=warps,
                                                      num_stages=stages) for w, c in zip(ws_, cs)])
            for s in ((2,) if CHECK or fc2 else (2, 3, 4)):
                grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn) * s,)
                add(f"serial split-K {s} {bm}x{bn}x{bk} w{warps} s{stages}",
                    [lambda w=w, c=c: mm_serial[grid](a, w, c, bias, slots, cnt, M, N, K, s, bm, bn, bk, 8, num_warps=warps,
                                                     num_stages=stages) for w, c in zip(ws_, cs)])
        res.sort()
        print(f"{name} M={M} N={N} K={K}:", flush=True)
        for t, label in res[:14] + [r for r in res if r[1] == "cublas" or r[1].startswith("tile 64x64x128")]:
            print(f"  {t:6.2f} us {label}", flush=True)


def sweep():
    """Tiles x warps x stages for the down-projection (K=3072) and the attention projection (K=768)."""
    import itertools

    for name, (M, N, K) in {"fc2": (1024, 768, 3072), "proj": (1024, 768, 768)}.items():
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ws = [torch.randn(K, N, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(12)]
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        cs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(12)]
        ref = torch.addmm(bias.float(), a.float(), ws[-1].float())
        res = [(graph_us([lambda w=w, c=c: torch.addmm(bias, a, w, out=c) for w, c in zip(ws, cs)]), "cublas")]
        for (bm, bn, bk), warps, stages in itertools.product(
                ((64, 64, 128), (64, 64, 64), (64, 64, 256), (64, 32, 128), (64, 32, 256), (32, 64, 128), (128, 32, 128),
                 (64, 128, 64), (128, 64, 64)), (4, 8), (2, 3, 4, 5)):
            grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
            fns = [lambda w=w, c=c: mm_tile[grid](a, w, c, bias, M, N, K, bm, bn, bk, 8, num_warps=warps, num_stages=stages)
                   for w, c in zip(ws, cs)]
            try:
                fns[-1]()
            except triton.runtime.errors.OutOfResources:
                continue
            err = ((cs[-1].float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (bm, bn, bk, warps, stages, err)
            res.append((graph_us(fns), f"{bm}x{bn}x{bk} w{warps} s{stages}"))
        res.sort()
        print(f"{name}: " + "; ".join(f"{t:.2f} {l}" for t, l in res[:12]) + " | current " +
              "; ".join(f"{t:.2f} {l}" for t, l in res if l in ("64x64x128 w4 s3", "cublas")), flush=True)


def sweep_wide():
    """Tiles x stages for the QKV projection, the MLP up-projection and the LM head (its weight stored [N, K])."""
    import itertools

    shapes = {"qkv": (1024, 2304, 768, False), "fc1": (1024, 3072, 768, False), "head": (1024, 50257, 768, True)}
    for name, (M, N, K, wt) in shapes.items():
        layers = 1 if wt else 12
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ws = [torch.randn(*((N, K) if wt else (K, N)), device="cuda", dtype=torch.bfloat16) * 0.05
              for _ in range(layers)]
        bias = torch.zeros(N, device="cuda", dtype=torch.bfloat16)
        cs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        ref = a.float() @ (ws[-1].float().t() if wt else ws[-1].float())
        res = []
        tiles = ((128, 256, 64, 8), (128, 128, 64, 4), (128, 128, 64, 8), (256, 128, 64, 8), (64, 256, 64, 4),
                 (64, 256, 64, 8)) if wt else \
            ((64, 128, 64, 4), (128, 128, 64, 8), (128, 64, 64, 4), (64, 256, 64, 4), (64, 64, 128, 4))
        for (bm, bn, bk, warps), stages in itertools.product(tiles, (3, 4, 5)):
            grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
            fns = [lambda w=w, c=c: mm_tile[grid](a, w, c, bias, M, N, K, bm, bn, bk, 8, False, wt, num_warps=warps,
                                                  num_stages=stages) for w, c in zip(ws, cs)]
            try:
                fns[-1]()
            except triton.runtime.errors.OutOfResources:
                continue
            err = ((cs[-1].float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (name, bm, bn, bk, warps, stages, err)
            res.append((graph_us(fns * (4 if wt else 1)), f"{bm}x{bn}x{bk} w{warps} s{stages}"))
        res.sort()
        print(f"{name}: " + "; ".join(f"{t:.2f} {l}" for t, l in res[:10]), flush=True)


def main(argv=None):
    p = parser(__doc__)
    add_check_option(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--fc2", action="store_true", help="the down-projection only, over more tiles")
    which.add_argument("--sweep", action="store_true", help="tiles x warps x stages for fc2 and proj")
    which.add_argument("--sweep-wide", action="store_true", help="tiles x stages for qkv, fc1 and the LM head")
    args = p.parse_args(argv)
    if args.check and (args.sweep or args.sweep_wide):
        p.error("--sweep and --sweep-wide time kernels on a GPU; --check runs the GEMM comparison's shapes")
    mode = run_mode(args)
    if args.sweep:
        sweep()
    elif args.sweep_wide:
        sweep_wide()
    else:
        gemms(mode, args.fc2)


if __name__ == "__main__":
    main()
