"""Probe: GPT-2 small on a GPU in one process: export the package there, check it against eager, time it (CUDA
events, median of 50) against eager and torch.compile(mode="reduce-overhead"), break its kernel time down by
kind (torch.profiler), and report the arithmetic floor (FLOPs over a measured 8192^3 bf16 matmul) and the
cold start of a fresh torch-free process. A quicker, narrower run than `python -m bench.run --suite gpu`, which is
the measurement of record; this one is for looking at where the time goes.

    python -m bench.probes.gpt2                       # on a GPU machine; bf16
    python -m bench.probes.gpt2 --dtype float32 --no-compile --profile-batches 1 8 --autotune --work DIR

It leaves the package (gpt2.tcpkg), the export's --dump and the kernel cache in the work folder
(`python -m bench.probes.call_overhead --package DIR/gpt2.tcpkg` reuses the package).

Results: bench/results/nvidia-h200-2026-11-29-gpt2-small-bf16-tcpkg.md,
bench/results/nvidia-h200-2026-11-29-gpt2-b8-where-time-goes.md."""
from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.probes.common import parser, require_gpu, work_folder


def timed(fn, n: int = 50) -> float:
    """ms a call: CUDA events, median of ``n`` after 5 warm-up calls."""
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def export_package(bm, dtype, work: Path, autotune: bool) -> Path:
    """The package, exported here with every stage's time; with ``autotune``, tuned at batches 1 and 8 (the report
    is printed: it is the dump's autotune.txt)."""
    from tcexport.exporter import export

    t0 = time.perf_counter()
    stages = {}
    dump = work / "dump"
    pkg = export(bm.build().to(dtype), bm.inputs(2), dynamic_shapes=bm.dynamic_shapes, targets=("cuda:sm_90",),
                 cache_dir=work / "cache", on_stage=lambda n, s: stages.__setitem__(n, round(s, 2)),
                 dump=dump, autotune=autotune, autotune_at=["batch=1", "batch=8"] if autotune else ())
    if autotune:
        print((dump / "autotune.txt").read_text(), flush=True)
    path = work / "gpt2.tcpkg"
    pkg.save(path)
    print("export", round(time.perf_counter() - t0, 1), "s", stages, os.path.getsize(path) >> 20, "MB", flush=True)
    return path


def against_eager(bm, m, model, ordered) -> dict:
    """Per batch: the relative error against eager, and the package (graph edges programmatic or ordinary) and
    eager timed; calls back to back on the host (the GPU time when calls wait for their index check)."""
    import torch

    res = {}
    for batch in (1, 8):
        (ids,) = bm.inputs(batch); ids = ids.cuda()
        with torch.no_grad():
            ref = m(ids).float()
            got = model(ids).float()
            rel = ((got - ref).norm() / ref.norm()).item()
            res[batch] = {"rel_err_vs_eager": rel, "tcpkg_ms": timed(lambda: model(ids)),
                          "eager_ms": timed(lambda: m(ids)), "tcpkg_ordered_ms": timed(lambda: ordered(ids))}
            torch.cuda.synchronize(); t0 = time.perf_counter()
            for _ in range(100):
                model(ids)
            res[batch]["tcpkg_host_us"] = round((time.perf_counter() - t0) * 1e4, 1)
            torch.cuda.synchronize()
        print(batch, res[batch], flush=True)
    return res


def _device_us(e) -> float:
    return getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)


def kernels_by_kind(bm, direct, batches) -> str:
    """The package's kernels (launched one by one: no graph) under torch.profiler: time per kind, the top kernels
    and the first 30 in order."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    summary = ""
    for prof_batch in batches:
        (ids,) = bm.inputs(prof_batch); ids = ids.cuda()
        direct(ids); torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                direct(ids)
            torch.cuda.synchronize()
        kinds = collections.defaultdict(float); counts = collections.Counter()
        ours = [e for e in p.key_averages() if re.match(r"k\d+_", e.key)]
        for e in ours:
            kind = re.sub(r"^k\d+_", "", e.key)
            kinds[kind] += _device_us(e) / 5; counts[kind] += e.count // 5
        tot = sum(kinds.values())
        summary += f"batch {prof_batch} per call by kind (us): " + str(
            {k: (round(v, 1), counts[k]) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}) + \
            " total " + str(round(tot, 1))
        top = sorted((_device_us(e) / 5, e.key) for e in ours)[-12:]
        summary += "\ntop kernels (us/call): " + str([(round(t, 1), k) for t, k in top[::-1]]) + "\n"
        ids_time = {int(re.match(r"k(\d+)_", e.key).group(1)): (round(_device_us(e) / 5, 1), e.key) for e in ours}
        summary += "first kernels (us/call): " + str([ids_time[i] for i in sorted(ids_time)[:30]]) + "\n"
    print(summary, flush=True)
    return summary


def against_compile(bm, m, res: dict, batches) -> str:
    """torch.compile(mode="reduce-overhead"): its first calls, its steady call, the ratios, and its kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    summary = ""
    c = torch.compile(m, mode="reduce-overhead")
    for batch in (1, 8):
        (ids,) = bm.inputs(batch); ids = ids.cuda()
        with torch.no_grad():
            t0 = time.perf_counter(); c(ids); c(ids); c(ids); torch.cuda.synchronize()
            res[batch]["compile_first_s"] = round(time.perf_counter() - t0, 1)
            res[batch]["compile_ro_ms"] = timed(lambda: c(ids))
        res[batch]["ratio_vs_compile_ro"] = res[batch]["tcpkg_ms"] / res[batch]["compile_ro_ms"]
        res[batch]["ratio_vs_eager"] = res[batch]["tcpkg_ms"] / res[batch]["eager_ms"]
        print(batch, res[batch], flush=True)
        if batch in batches:  # torch.compile's kernels, for comparison
            with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(5):
                    c(ids)
                torch.cuda.synchronize()
            top = sorted((_device_us(e) / 5, e.count // 5, e.key)
                         for e in p.key_averages() if "CUDA" in str(getattr(e, "device_type", "")))[::-1]
            summary += (f"compile-ro batch {batch}: kernel total {round(sum(t for t, _, _ in top), 1)} us; top: "
                        + str([(round(t, 1), n, k[:60]) for t, n, k in top[:25]]) + "\n")
    return summary


def arithmetic_floor() -> None:
    """FLOPs of GPT-2 small at batches 1 and 8 over the measured rate of an 8192^3 bf16 matmul."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda: a @ b, n=10)
    rate = 2 * 8192**3 / (ms * 1e-3)
    floors = {}
    for batch in (1, 8):
        T = batch * 128
        flops = 12 * (2 * T * 768 * (2304 + 768 + 2 * 3072) + 2 * 2 * batch * 12 * 128 * 128 * 64) + \
            2 * T * 768 * 50257
        floors[batch] = {"gflop": round(flops / 1e9, 1), "floor_ms": round(flops / rate * 1e3, 3)}
    print("matmul TFLOP/s", round(rate / 1e12), "floors", floors)


def cold_start(bm, path: Path, work: Path) -> None:
    """A fresh torch-free process, twice: from its first import to its first result."""
    import numpy as np

    ids = work / "ids.npy"
    np.save(ids, bm.inputs(1)[0].numpy())
    code = ("import sys, time; t = time.perf_counter(); sys.modules['torch'] = None; import numpy as np; "
            f"import tcexport.loader as L; m = L.load({str(path)!r}, device='cuda'); y = m(np.load({str(ids)!r})); "
            "print(round(time.perf_counter() - t, 3), y.shape)")
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
        print("cold start tcpkg (fresh process, import to first result):", out)


def main(argv=None):
    p = parser(__doc__, work=True)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--profile-batches", type=int, nargs="*", default=[8], help="batches to profile by kernel")
    p.add_argument("--autotune", action="store_true", help="export with --autotune at batches 1 and 8")
    args = p.parse_args(argv)
    require_gpu()
    import torch

    import tcexport.loader as L
    from bench.models import get

    work = work_folder(args)
    dtype = getattr(torch, args.dtype)
    bm = get("gpt2-small")
    m = bm.build().to(dtype).cuda()
    path = export_package(bm, dtype, work, args.autotune)
    t0 = time.perf_counter()
    model = L.load(path, device="cuda")
    print("load", round(time.perf_counter() - t0, 2), "s", flush=True)
    ordered = L.load(path, device="cuda", dependent_launch=False)  # each kernel after the last ends
    res = against_eager(bm, m, model, ordered)
    summary = kernels_by_kind(bm, L.load(path, device="cuda", graphs=False), args.profile_batches)
    if not args.no_compile:
        summary += against_compile(bm, m, res, args.profile_batches)
    print(json.dumps(res))
    print(summary)
    arithmetic_floor()
    cold_start(bm, path, work)
    print(json.dumps(res))
    print(summary)


if __name__ == "__main__":
    main()
