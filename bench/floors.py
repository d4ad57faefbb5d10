"""How fast a model could possibly run here: the floors a suite reports each latency against.

The **arithmetic floor** is the model's FLOPs (``torch.utils.flop_counter``: GEMMs, convolutions, attention) over the
GEMM peak measured in the same run (a large torch matmul at the suite's dtype and thread count). The **memory floor**
is the bytes a call must move at least once (weights at their stored width, inputs, the output) over the bandwidth
of a large copy measured the same way. Neither is reachable; a backend at 2x its larger floor is doing well. Both
peaks are what torch reaches here, not datasheet numbers, so a floor can be beaten by a few percent.
"""

from __future__ import annotations

import time

import torch

# large enough to leave every cache and reach steady state, small enough for a few seconds on 2 cores
GEMM_N = {"cpu": 2048, "cuda": 8192}
COPY_BYTES = {"cpu": 512 << 20, "cuda": 2 << 30}


def _best_seconds(fn, device: str, min_runs: int = 3, budget_s: float = 3.0) -> float:
    """The fastest of several timed calls (a peak, so the least disturbed call is the one that counts)."""
    fn()
    best = float("inf")
    start = time.perf_counter()
    runs = 0
    while runs < min_runs or (time.perf_counter() - start < budget_s and runs < 50):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        runs += 1
    return best


def machine_peaks(device: str, dtype: torch.dtype, threads: int) -> dict:
    """The GEMM peak (FLOP/s) at ``dtype`` and the copy bandwidth (bytes/s), measured with torch on this machine
    at ``threads`` CPU threads. On the CPU, a dtype without fast GEMMs here (bf16 on a CPU without bf16 units)
    gives a low peak, and so a low arithmetic floor: the floor is this machine's, not the format's."""
    torch.set_num_threads(threads)
    n = GEMM_N[device] if dtype == torch.float32 or device == "cuda" else GEMM_N[device] // 2
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=g).to(dtype)
    b = torch.randn(n, n, device=device, generator=g).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    gemm_s = _best_seconds(lambda: torch.mm(a, b, out=out), device)
    del a, b, out
    nbytes = COPY_BYTES[device]
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    copy_s = _best_seconds(lambda: dst.copy_(src), device)
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"gemm_flops_per_s": 2 * n ** 3 / gemm_s, "gemm": f"{n}x{n}x{n} {str(dtype).split('.')[-1]} torch.mm",
            "copy_bytes_per_s": 2 * nbytes / copy_s, "copy": f"{nbytes >> 20} MiB copy_ (read + write)",
            "threads": threads, "device": device}


def count_flops(module: torch.nn.Module, inputs: tuple) -> tuple[int, object]:
    """FLOPs of one forward (matmuls, convolutions, attention; elementwise work is not counted) and its output."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        out = module(*inputs)
    return counter.get_total_flops(), out


def weight_bytes(module: torch.nn.Module, element_size: int) -> int:
    """Parameters and buffers at ``element_size`` bytes per floating element (what a call must read once)."""
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        total += t.numel() * (element_size if t.is_floating_point() else t.element_size())
    return total


def floor_ms(flops: int, nbytes: int, peaks: dict) -> dict:
    return {"flops": flops, "bytes": nbytes,
            "arith_ms": 1e3 * flops / peaks["gemm_flops_per_s"],
            "memory_ms": 1e3 * nbytes / peaks["copy_bytes_per_s"]}
