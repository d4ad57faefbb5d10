"""GPT-2 small (bf16) on a GPU in one process: export the package there, check it against eager, time it (CUDA
events, median of 50) against eager and torch.compile(mode="reduce-overhead"), break its kernel time down by
kind (torch.profiler), and report the arithmetic floor (FLOPs over a measured 8192^3 bf16 matmul) and the
cold start of a fresh torch-free process. A quicker, narrower run than `python -m bench.run --suite gpu`:

    python -m bench.gpu_gpt2            # DT=float32 for float32, COMPILE=0 to skip torch.compile, PB=1,8 to profile
                                        # batches 1 and 8, AUTOTUNE=1 to export with --autotune at batch 1 and 8
"""
import os, sys, time, json
import torch
sys.path.insert(0, os.getcwd())
from bench.models import get
from tcexport.exporter import export
import tcexport.loader as L

dtype = getattr(torch, os.environ.get("DT", "bfloat16"))
bm = get("gpt2-small")
m = bm.build().to(dtype).cuda()
t0 = time.perf_counter()
stages = {}
tune = os.environ.get("AUTOTUNE", "0") == "1"  # --autotune at batch 1 and 8 (the report: /tmp/gpt2dump/autotune.txt)
pkg = export(bm.build().to(dtype), bm.inputs(2), dynamic_shapes=bm.dynamic_shapes, targets=("cuda:sm_90",),
             cache_dir="/tmp/tccache", on_stage=lambda n, s: stages.__setitem__(n, round(s, 2)),
             dump="/tmp/gpt2dump", autotune=tune, autotune_at=["batch=1", "batch=8"] if tune else ())
if tune:
    print(open("/tmp/gpt2dump/autotune.txt").read(), flush=True)
pkg.save("/tmp/gpt2.tcpkg")
print("export", round(time.perf_counter() - t0, 1), "s", stages, os.path.getsize("/tmp/gpt2.tcpkg") >> 20, "MB", flush=True)
t0 = time.perf_counter()
model = L.load("/tmp/gpt2.tcpkg", device="cuda")
print("load", round(time.perf_counter() - t0, 2), "s", flush=True)
ordered = L.load("/tmp/gpt2.tcpkg", device="cuda", dependent_launch=False)  # each kernel after the last ends

def timed(fn, n=50):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); times.append(a.elapsed_time(b))
    times.sort(); return times[len(times) // 2]

res = {}
for batch in (1, 8):
    (ids,) = bm.inputs(batch); ids = ids.cuda()
    with torch.no_grad():
        ref = m(ids).float()
        got = model(ids).float()
        rel = ((got - ref).norm() / ref.norm()).item()
        res[batch] = {"rel_err_vs_eager": rel, "tcpkg_ms": timed(lambda: model(ids)), "eager_ms": timed(lambda: m(ids)),
                      "tcpkg_ordered_ms": timed(lambda: ordered(ids))}
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(100): model(ids)
        res[batch]["tcpkg_host_us"] = round((time.perf_counter() - t0) * 1e4, 1)  # back to back: the GPU time when calls wait for their index check
        torch.cuda.synchronize()
    print(batch, res[batch], flush=True)

from torch.profiler import profile, ProfilerActivity
import re, collections
direct = L.load("/tmp/gpt2.tcpkg", device="cuda", graphs=False)
SUMMARY = ""
for prof_batch in map(int, os.environ.get("PB", "8").split(",")):
    (ids,) = bm.inputs(prof_batch); ids = ids.cuda()
    direct(ids); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5): direct(ids)
        torch.cuda.synchronize()
    kinds = collections.defaultdict(float); counts = collections.Counter()
    for e in p.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if re.match(r"k\d+_", e.key):
            kind = re.sub(r"^k\d+_", "", e.key)
            kinds[kind] += t / 5; counts[kind] += e.count // 5
    tot = sum(kinds.values())
    SUMMARY += f"batch {prof_batch} per call by kind (us): " + str({k: (round(v, 1), counts[k]) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}) + " total " + str(round(tot, 1))
    top = sorted(((getattr(e, "device_time_total", 0) or e.cuda_time_total) / 5, e.key) for e in p.key_averages() if re.match(r"k\d+_", e.key))[-12:]
    SUMMARY += "\ntop kernels (us/call): " + str([(round(t, 1), k) for t, k in top[::-1]]) + "\n"
    ids_time = {int(re.match(r"k(\d+)_", e.key).group(1)): (round((getattr(e, "device_time_total", 0) or e.cuda_time_total) / 5, 1), e.key)
                for e in p.key_averages() if re.match(r"k\d+_", e.key)}
    SUMMARY += "first kernels (us/call): " + str([ids_time[i] for i in sorted(ids_time)[:30]]) + "\n"
print(SUMMARY, flush=True)

if os.environ.get("COMPILE", "1") == "1":
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
        if batch in map(int, os.environ.get("PB", "8").split(",")):  # torch.compile's kernels, for comparison
            with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(5): c(ids)
                torch.cuda.synchronize()
            top = sorted(((getattr(e, "device_time_total", 0) or e.cuda_time_total) / 5, e.count // 5, e.key)
                         for e in p.key_averages() if "CUDA" in str(getattr(e, "device_type", "")))[::-1]
            SUMMARY += (f"compile-ro batch {batch}: kernel total {round(sum(t for t, _, _ in top), 1)} us; top: "
                        + str([(round(t, 1), n, k[:60]) for t, n, k in top[:25]]) + "\n")
print(json.dumps(res))
print(SUMMARY)

# arithmetic floor: FLOPs over the measured bf16 matmul rate
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
ms = timed(lambda: a @ b, n=10)
rate = 2 * 8192**3 / (ms * 1e-3)
floors = {}
for batch in (1, 8):
    T = batch * 128
    flops = 12 * (2 * T * 768 * (2304 + 768 + 2 * 3072) + 2 * 2 * batch * 12 * 128 * 128 * 64) + 2 * T * 768 * 50257
    floors[batch] = {"gflop": round(flops / 1e9, 1), "floor_ms": round(flops / rate * 1e3, 3)}
print("matmul TFLOP/s", round(rate / 1e12), "floors", floors)
import subprocess, numpy as np
np.save("/tmp/ids.npy", bm.inputs(1)[0].numpy())
code = ("import sys, time; t = time.perf_counter(); sys.modules['torch'] = None; import numpy as np; "
        "import tcexport.loader as L; m = L.load('/tmp/gpt2.tcpkg', device='cuda'); y = m(np.load('/tmp/ids.npy')); "
        "print(round(time.perf_counter() - t, 3), y.shape)")
for _ in range(2):
    print("cold start tcpkg (fresh process, import to first result):", subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip())
print(json.dumps(res))
print(SUMMARY)
