"""How close the CPU package's GEMMs come to the machine's float32 peak, shape by shape.

    python -m bench.probes.cpu_gemm --threads 2
    python -m bench.probes.cpu_gemm --threads 2 --shapes 64x768x3072 394x768x2304

Each shape M x K x N is one `nn.Linear(K, N, bias=False)` exported as a package with M rows (no dynamic dims); the
package's call is timed through the loader next to `torch.mm` on the same operands (oneDNN/MKL), and both are put
against the peak: the best of a few large square `torch.mm` at the same thread count. The M = 1 shapes are bound
by the weights' bytes, so those are also shown against the measured copy bandwidth. Results, written up by hand:
bench/results/2core-2026-12-02-cpu-gemm.md.
"""

from __future__ import annotations

import time

from . import common

DEFAULT_SHAPES = ["1x768x3072", "1x768x50257", "8x768x3072", "64x768x768", "64x768x3072", "64x3072x768",
                  "128x768x2304", "394x768x2304", "394x3072x768", "512x512x512", "3136x64x256", "784x512x128"]


def _best(fn, seconds: float = 0.4) -> float:
    fn()
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def peaks(threads: int) -> tuple[float, float]:
    """(GEMM GFLOP/s, copy GB/s) on this machine at ``threads``."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    flops = 2 * 2048 ** 3 / _best(lambda: torch.mm(a, b), 1.5) / 1e9
    src, dst = torch.empty(64 * 2 ** 20 // 4), torch.empty(64 * 2 ** 20 // 4)
    bw = 2 * src.numel() * 4 / _best(lambda: dst.copy_(src), 1.0) / 1e9
    return flops, bw


def measure(shape: str, threads: int, work) -> dict:
    import numpy as np
    import torch

    import tcexport.loader as L
    from tcexport.exporter import export

    m, k, n = (int(v) for v in shape.split("x"))
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n, bias=False).eval()
    x = torch.randn(m, k)
    path = work / f"linear-{shape}.tcpkg"
    if not path.exists():
        export(lin, (x,), targets=("cpu",), cache_dir=work / "cache").save(path)
    model = L.load(path, num_threads=threads)
    xn = x.numpy()
    assert np.allclose(model(xn), lin(x).detach().numpy(), rtol=1e-3, atol=1e-3)
    w = lin.weight.detach()
    with torch.no_grad():
        t_torch = _best(lambda: torch.nn.functional.linear(x, w))
    t_pkg = _best(lambda: model(xn))
    return {"shape": shape, "flops": 2 * m * k * n, "bytes": 4 * (k * n + m * k + m * n), "pkg_s": t_pkg,
            "torch_s": t_torch}


def main(argv=None) -> None:
    p = common.parser(__doc__, work=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES, help="M x K x N of each GEMM")
    args = p.parse_args(argv)
    work = common.work_folder(args)
    flops, bw = peaks(args.threads)
    print(f"peak: {flops:.0f} GFLOP/s (2048^3 torch.mm), copy {bw:.1f} GB/s, {args.threads} threads")
    print(f"{'M x K x N':>14s} {'tcpkg us':>9s} {'torch us':>9s} {'tcpkg/torch':>11s} {'tcpkg %peak':>11s} "
          f"{'torch %peak':>11s} {'tcpkg %bw':>9s}")
    for shape in args.shapes:
        r = measure(shape, args.threads, work)
        gf = lambda s: r["flops"] / s / 1e9
        print(f"{shape:>14s} {r['pkg_s'] * 1e6:9.1f} {r['torch_s'] * 1e6:9.1f} {r['pkg_s'] / r['torch_s']:11.2f} "
              f"{100 * gf(r['pkg_s']) / flops:10.0f}% {100 * gf(r['torch_s']) / flops:10.0f}% "
              f"{100 * r['bytes'] / r['pkg_s'] / 1e9 / bw:8.0f}%", flush=True)


if __name__ == "__main__":
    main()
