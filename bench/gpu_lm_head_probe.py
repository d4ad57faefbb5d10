"""Probe (`python -m bench.gpu_lm_head_probe` on a GPU machine, sm_90+): GPT-2 small bf16's LM head as a persistent
GEMM with TMA loads (what the heuristics choose, codegen_triton.gemm_config) against one program per tile, in the
whole model. GPT-2 is exported twice, the second time with the persistent template turned off; both packages are
timed at batches 1 and 8 (the harness's time_calls: CUDA events, median of 60; three interleaved rounds), and the
LM head kernel is timed inside the model's CUDA graph with torch.profiler, next to the same GEMM alone
(triton.testing.do_bench, between L2 flushes) and back to back (20 launches in one CUDA graph)."""
import os
import re
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import tcexport.loader as L  # noqa: E402
from bench.models import get  # noqa: E402
from bench.run import compare_interleaved  # noqa: E402
from tcexport.exporter import export
from tcexport.exporter.cuda import codegen as codegen_triton  # noqa: E402

bm = get("gpt2-small")
GEMM_CONFIG = codegen_triton.gemm_config


def build(persistent: bool) -> str:
    codegen_triton.gemm_config = GEMM_CONFIG if persistent else \
        (lambda *args, **kw: GEMM_CONFIG(*args, **{**kw, "tma": False}))
    try:
        t0 = time.perf_counter()
        pkg = export(bm.build().to(torch.bfloat16), bm.inputs(2), dynamic_shapes=bm.dynamic_shapes,
                     targets=("cuda:sm_90",), cache_dir="/tmp/tccache")
    finally:
        codegen_triton.gemm_config = GEMM_CONFIG
    path = f"/tmp/gpt2_{'persistent' if persistent else 'tiles'}.tcpkg"
    pkg.save(path)
    print(f"{'persistent' if persistent else 'tiles'}: export {time.perf_counter() - t0:.1f} s", flush=True)
    return path


def head_kernel_us(model, ids) -> dict:
    """Per-call device time of the model's last GEMM (the LM head) and of all kernels, in graph replays."""
    for _ in range(3):
        model(ids)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            model(ids)
        torch.cuda.synchronize()
    times = {e.key: (getattr(e, "device_time_total", 0) or e.cuda_time_total) / 10 for e in p.key_averages()
             if re.match(r"k\d+_", e.key)}
    gemms = sorted((k for k in times if "gemm" in k), key=lambda k: int(re.match(r"k(\d+)_", k).group(1)))
    return {"head": round(times[gemms[-1]], 1), "all": round(sum(times.values()), 1)}


paths = {name: build(name == "persistent") for name in ("persistent", "tiles")}
models = {name: L.load(path, device="cuda") for name, path in paths.items()}
inputs = {batch: bm.inputs(batch)[0].cuda() for batch in (1, 8)}
compare_interleaved(models, inputs, width=12)
for name, m in models.items():
    print(f"batch 8 {name:12s} in the graph (torch.profiler, us a call): {head_kernel_us(m, inputs[8])}", flush=True)
want = models["tiles"](inputs[8]).float()
got = models["persistent"](inputs[8]).float()
print("persistent vs tiles, relative difference:", ((got - want).norm() / want.norm()).item(), flush=True)

# the same GEMM alone: 1024 x 50257 x 768
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

a = torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16)
w = torch.randn(50257, 768, device="cuda", dtype=torch.bfloat16) * 0.05
for name, m in models.items():
    last = [k for k in m._kernels if "gemm" in k.name][-1].name.split("_")[0]  # the LM head's launches
    for k in (k for k in m._kernels if k.name.split("_")[0] == last):
        print(f"{name}: LM head launch {k.name}, grid {k.grid}, scratch {k.scratch}", flush=True)
print("cuBLAS alone, N=50257 (do_bench):", round(do_bench(lambda: a @ w.T) * 1e3, 1), "us", flush=True)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for _ in range(20):
        a @ w.T
g.replay()
torch.cuda.synchronize()
print("cuBLAS back to back, N=50257 (20 in a graph):", round(do_bench(g.replay) * 1e3 / 20, 1), "us", flush=True)
from bench.gpu_persistent_gemm_probe import mm_persist  # noqa: E402
from bench.gpu_split_k_probe import mm_tile  # noqa: E402

sms = torch.cuda.get_device_properties(0).multi_processor_count
c = torch.empty(1024, 50257, device="cuda", dtype=torch.bfloat16)
tiles = 8 * triton.cdiv(50257, 256)
zero = torch.zeros(50257, device="cuda", dtype=torch.bfloat16)
calls = {"tiles": lambda: mm_tile[(tiles,)](a, w, c, zero, 1024, 50257, 768, 128, 256, 64, 8, WT=True, num_warps=8,
                                            num_stages=3),
         "persistent": lambda: mm_persist[(min(sms, tiles),)](a, w, c, 1024, 50257, 768, 128, 256, 64, 8, sms, True,
                                                               True, num_warps=8, num_stages=4)}
# the package's own LM head kernel, compiled as build_cuda does and launched as the loader does, with its tile mask
# in 32 bits (as generated) and in 64 bits (as the symbols are: the first version of the persistent template)
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from tcexport.exporter.cuda import build as build_cuda  # noqa: E402
from tcexport.exporter.cuda.codegen import Launch  # noqa: E402
from tcexport.loader.archive import open_archive  # noqa: E402
from tcexport.loader.native_cuda import ParamBlock  # noqa: E402

archive = open_archive(paths["persistent"])
source = archive.read("src/cuda/model_triton.py").decode()
launch = [l for l in archive.manifest.cuda.launches if "__sm_count" in str(l.grid)][-1]
start = source.index(f"def {launch.name}(")
kernel = source[start:source.index("gdc_launch_dependents()", start)] + "gdc_launch_dependents()\n"
header = source[:source.index("@triton.jit\ndef k0_")]
wide = kernel.replace("tl.cast(M, tl.int32)", "M").replace("tl.cast(N, tl.int32)", "N").replace(
    "        mask = (rm", "        rm = rm.to(tl.int64)\n        rn = rn.to(tl.int64)\n        mask = (rm")
dev = models["persistent"].device
scratch = torch.empty(256 * dev.sm_count, dtype=torch.uint8, device="cuda")
stream = torch.cuda.current_stream().cuda_stream
for name, text in (("as generated (32-bit mask)", kernel), ("64-bit mask", wide)):
    module = build_cuda._load_module(header + "@triton.jit\n" + text, Path(tempfile.mkdtemp()))
    args = text[text.index("(") + 1:].split(", ")[:len(launch.params)]
    assert [p["kind"] for p in launch.params] == ["temp", "weight", "output", "symbol", "symbol"], launch.params
    sig = dict(zip(args, ["*bf16"] * 3 + ["i64"] * 2))
    sig.update({k: "constexpr" for k in launch.block})
    cubin = build_cuda._compile_one(module, Launch(launch.name, [], sig, dict(launch.block), (), launch.num_warps,
                                                   launch.num_stages, persistent=True), 90)
    _, fn = dev.load_function(cubin.data, cubin.function, cubin.shared)
    block = ParamBlock([a.data_ptr(), w.data_ptr(), c.data_ptr(), 8, 128], ["ptr"] * 3 + ["i64"] * 2,
                       scratch.data_ptr())
    call = lambda: dev.launch(fn, (min(dev.sm_count, tiles), 1, 1), cubin.num_warps * 32, cubin.shared, stream,
                              block.address)
    print(f"package kernel, {name}: alone {do_bench(call) * 1e3:.1f} us", flush=True)

for name, call in calls.items():
    call()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            call()
    g.replay()
    torch.cuda.synchronize()
    print(f"template {name}: alone {do_bench(call) * 1e3:.1f} us, back to back {do_bench(g.replay) * 1e3 / 20:.1f} us",
          flush=True)
