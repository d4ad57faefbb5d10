"""Probe (`python -m bench.probes.lm_head` on a GPU machine, sm_90+): GPT-2 small bf16's LM head as a persistent
GEMM with TMA loads (what the heuristics choose: exporter/cuda/, gemm_config) against one program per tile, in the
whole model. GPT-2 is exported twice, the second time with CudaOptions(tma=False) (exporter/options.py: the
persistent template turned off); both packages are timed at batches 1 and 8 (the harness's time_calls: CUDA
events, median of 60; three interleaved rounds), and the LM head kernel is timed inside the model's CUDA graph
with torch.profiler, next to the same GEMM alone (triton.testing.do_bench, between L2 flushes) and back to back
(20 launches in one CUDA graph): cuBLAS, the templates (bench/probes/gemm_kernels.py), and the package's own kernel
with its tile mask in 32 bits (as generated) and in 64 bits (the first version of the persistent template). That
last part compiles the kernel as the CUDA build does, through the exporter's and the loader's private helpers
(package_kernel_variants), so it is the first thing to mend when those move.

Results: bench/results/nvidia-h200-2026-11-30-persistent-lm-head.md."""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

from bench.probes.common import export_gpt2, parser, require_gpu, torch_allocator_for_triton, work_folder

M, N, K = 1024, 50257, 768  # GPT-2 small's LM head at batch 8


def head_kernel_us(model, ids) -> dict:
    """Per-call device time of the model's last GEMM (the LM head) and of all kernels, in graph replays."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        model(ids)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            model(ids)
        torch.cuda.synchronize()
    times = {e.key: (getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)) / 10
             for e in p.key_averages() if re.match(r"k\d+_", e.key)}
    gemms = sorted((k for k in times if "gemm" in k), key=lambda k: int(re.match(r"k(\d+)_", k).group(1)))
    return {"head": round(times[gemms[-1]], 1), "all": round(sum(times.values()), 1)}


def in_the_model(paths: dict) -> dict:
    """Both packages timed whole, their LM head in the graph, and how far apart their results are."""
    import tcexport.loader as L
    from bench.models import get
    from bench.run import compare_interleaved

    models = {name: L.load(path, device="cuda") for name, path in paths.items()}
    bm = get("gpt2-small")
    inputs = {batch: bm.inputs(batch)[0].cuda() for batch in (1, 8)}
    compare_interleaved(models, inputs, width=12)
    for name, m in models.items():
        print(f"batch 8 {name:12s} in the graph (torch.profiler, us a call): {head_kernel_us(m, inputs[8])}",
              flush=True)
    want = models["tiles"](inputs[8]).float()
    got = models["persistent"](inputs[8]).float()
    print("persistent vs tiles, relative difference:", ((got - want).norm() / want.norm()).item(), flush=True)
    for name, m in models.items():
        last = [k for k in m._kernels if "gemm" in k.name][-1].name.split("_")[0]  # the LM head's launches
        for k in (k for k in m._kernels if k.name.split("_")[0] == last):
            print(f"{name}: LM head launch {k.name}, grid {k.grid}, scratch {k.scratch}", flush=True)
    return models


def alone_and_back_to_back(call) -> tuple[float, float]:
    """us of ``call`` alone (do_bench) and back to back (20 in one CUDA graph)."""
    import torch
    from triton.testing import do_bench

    call()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            call()
    g.replay()
    torch.cuda.synchronize()
    return do_bench(call) * 1e3, do_bench(g.replay) * 1e3 / 20


def package_kernel_variants(path: Path, device, a, w, c) -> None:
    """The package's own LM head kernel, compiled as the CUDA build does and launched as the loader does, with its
    tile mask in 32 bits (as generated) and in 64 bits (as the symbols are)."""
    import torch
    from triton.testing import do_bench

    from tcexport.exporter.cuda import build as build_cuda
    from tcexport.exporter.cuda.launches import TritonLaunch as Launch
    from tcexport.loader.archive import open_archive
    from tcexport.loader.native_cuda import ParamBlock

    archive = open_archive(path)
    source = archive.read("src/cuda/model_triton.py").decode()
    launch = [l for l in archive.manifest.cuda.launches if "__sm_count" in str(l.grid)][-1]
    start = source.index(f"def {launch.name}(")
    kernel = source[start:source.index("gdc_launch_dependents()", start)] + "gdc_launch_dependents()\n"
    header = source[:source.index("@triton.jit\ndef k0_")]
    wide = kernel.replace("tl.cast(M, tl.int32)", "M").replace("tl.cast(N, tl.int32)", "N").replace(
        "        mask = (rm", "        rm = rm.to(tl.int64)\n        rn = rn.to(tl.int64)\n        mask = (rm")
    tiles = 8 * -(-N // 256)
    scratch = torch.empty(256 * device.sm_count, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    for name, text in (("as generated (32-bit mask)", kernel), ("64-bit mask", wide)):
        module = build_cuda._load_module(header + "@triton.jit\n" + text, Path(tempfile.mkdtemp()))
        args = text[text.index("(") + 1:].split(", ")[:len(launch.params)]
        if [p["kind"] for p in launch.params] != ["temp", "weight", "output", "symbol", "symbol"]:
            raise SystemExit(f"the LM head's parameters changed: {launch.params}")
        sig = dict(zip(args, ["*bf16"] * 3 + ["i64"] * 2))
        sig.update({k: "constexpr" for k in launch.block})
        cubin = build_cuda._compile_one(module, Launch(launch.name, [], sig, dict(launch.block), (), launch.num_warps,
                                                       launch.num_stages, persistent=True), 90)
        _, fn = device.load_function(cubin.data, cubin.function, cubin.shared)
        block = ParamBlock([a.data_ptr(), w.data_ptr(), c.data_ptr(), 8, 128], ["ptr"] * 3 + ["i64"] * 2,
                           scratch.data_ptr())
        call = lambda: device.launch(fn, (min(device.sm_count, tiles), 1, 1), cubin.num_warps * 32, cubin.shared,
                                     stream, block.address)
        print(f"package kernel, {name}: alone {do_bench(call) * 1e3:.1f} us", flush=True)


def alone(paths: dict, device) -> None:
    """The same GEMM outside the model: cuBLAS, the two templates, and the package's kernel."""
    import torch

    from bench.probes.gemm_kernels import mm_persist, mm_tile

    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
    one, back = alone_and_back_to_back(lambda: a @ w.T)
    print(f"cuBLAS, N={N}: alone {one:.1f} us, back to back (20 in a graph) {back:.1f} us", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    tiles = 8 * -(-N // 256)
    zero = torch.zeros(N, device="cuda", dtype=torch.bfloat16)
    calls = {"tiles": lambda: mm_tile[(tiles,)](a, w, c, zero, M, N, K, 128, 256, 64, 8, WT=True, num_warps=8,
                                                num_stages=3),
             "persistent": lambda: mm_persist[(min(sms, tiles),)](a, w, c, M, N, K, 128, 256, 64, 8, sms, True,
                                                                   True, num_warps=8, num_stages=4)}
    package_kernel_variants(paths["persistent"], device, a, w, c)
    for name, call in calls.items():
        one, back = alone_and_back_to_back(call)
        print(f"template {name}: alone {one:.1f} us, back to back {back:.1f} us", flush=True)


def main(argv=None):
    args = parser(__doc__, work=True).parse_args(argv)
    require_gpu()
    from tcexport.exporter.options import CudaOptions

    work = work_folder(args)
    torch_allocator_for_triton()  # mm_persist's TMA descriptors
    paths = {name: export_gpt2(work / f"gpt2_{name}.tcpkg", work / "cache", options, label=name)
             for name, options in (("persistent", CudaOptions()), ("tiles", CudaOptions(tma=False)))}
    models = in_the_model(paths)
    alone(paths, models["persistent"].device)


if __name__ == "__main__":
    main()
