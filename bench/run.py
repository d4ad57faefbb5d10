"""Run a benchmark suite: every backend on the same models, inputs and threads, in one run.

    python -m bench.run --suite cpu-quick            # a few minutes on 2 cores
    python -m bench.run --suite gpu                  # on a CUDA machine
    python -m bench.run --suite gpu-gpt2-bf16 --cold-runs 1   # GPT-2 small bf16 only (about 5 minutes)
    python -m bench.run --suite gpu-gpt2-bf16 --autotune      # the same, tcpkg built with --autotune

Writes bench/results/<machine>-<date>-<suite>.json, a markdown table beside it, and PNG plots (see bench/README.md).
A backend that fails records its error and the run goes on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from . import report
from .backends import Context, as_numpy, backends_for, to_device
from .models import get

RESULTS = Path(__file__).resolve().parent / "results"

SUITES = {
    "cpu-quick": {"device": "cpu", "runs": [("mlp", torch.float32, [1, 8, 64]),
                                            ("decoder", torch.float32, [1, 8]),
                                            ("gpt2-tiny", torch.float32, [1, 8])]},
    "gpu": {"device": "cuda", "runs": [("gpt2-small", torch.float32, [1, 8]),
                                       ("gpt2-small", torch.bfloat16, [1, 8]),
                                       ("mlp", torch.float32, [1, 8, 64]),
                                       ("decoder", torch.float32, [1, 8]),
                                       ("gpt2-tiny", torch.float32, [1, 8])]},
    # issue 5's speed target alone, in a few minutes: GPT-2 small bf16, every backend
    "gpu-gpt2-bf16": {"device": "cuda", "runs": [("gpt2-small", torch.bfloat16, [1, 8])]},
}


def machine_name(device: str) -> str:
    if device == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
    else:
        name = platform.processor() or "cpu"
        try:
            text = Path("/proc/cpuinfo").read_text()
            name = re.search(r"model name\s*:\s*(.*)", text).group(1)
        except (OSError, AttributeError):
            pass
        name = f"{os.cpu_count()}core-{name}"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60]


def time_calls(fn, xs, device: str, warmup: int = 5, min_calls: int = 30, min_seconds: float = 0.5,
               max_calls: int = 2000) -> dict:
    """Warm up, then time single calls until enough samples; CUDA events on GPU."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(*xs)
        if device == "cuda":
            torch.cuda.synchronize()
        times = []
        start = time.perf_counter()
        while (len(times) < min_calls or time.perf_counter() - start < min_seconds) and len(times) < max_calls:
            if device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn(*xs)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t = time.perf_counter()
                fn(*xs)
                times.append(time.perf_counter() - t)
    ms = sorted(t * 1e3 for t in times)
    q = lambda p: ms[min(len(ms) - 1, int(p * len(ms)))]
    return {"median_ms": statistics.median(ms), "p10_ms": q(0.1), "p90_ms": q(0.9), "calls": len(ms)}


def compare_interleaved(models: dict, inputs: dict, rounds: int = 3, width: int = 28) -> dict:
    """A/B timing on a GPU: every model on every batch's inputs (``inputs``: batch -> tensor), ``rounds`` times
    interleaved so that a drift of the machine shows in every row alike; prints, per batch and model, each round's
    median call (time_calls: CUDA events, 60 calls) and the least, in us; returns {(batch, name): [us, ...]}."""
    res: dict = {}
    for _ in range(rounds):
        for batch, x in inputs.items():
            for name, m in models.items():
                res.setdefault((batch, name), []).append(
                    time_calls(m, (x,), "cuda", min_calls=60, min_seconds=0)["median_ms"] * 1e3)
    for (batch, name), ts in sorted(res.items()):
        print(f"batch {batch} {name:{width}s} " + " ".join(f"{t:7.1f}" for t in ts) + f"  min {min(ts):7.1f} us",
              flush=True)
    return res


def cold_start(code: str, runs: int, env_extra: dict | None = None) -> dict:
    """Median of several fresh processes, each from its first import to its first result."""
    samples = []
    for k in range(runs):
        env = {**os.environ, **(env_extra or {})}
        env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-inductor-")  # a truly cold compile
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
        lines = proc.stdout.strip().splitlines()
        if not lines or not lines[-1].startswith("{"):
            raise RuntimeError(f"cold-start process exited with {proc.returncode}: {proc.stderr.strip()[-1500:]}")
        sample = json.loads(lines[-1])
        if proc.returncode != 0:  # it produced its result, then died (seen: AOTInductor on CUDA at exit)
            sample["exit_code"] = proc.returncode
        samples.append(sample)
    secs = [s["seconds"] for s in samples]
    return {"median_s": statistics.median(secs), "runs_s": secs,
            "exit_codes": sorted({s.get("exit_code", 0) for s in samples}),
            "peak_rss_mb": max(s["peak_rss_mb"] for s in samples),
            "peak_device_mb": max((s["peak_device_mb"] or 0) for s in samples) or None}


def reference(bm, batches) -> dict:
    """Eager PyTorch in float64 on the CPU: what every backend's output is compared with."""
    m = bm.build().double()
    out = {}
    with torch.no_grad():
        for b in batches:
            xs = [x.double() if x.is_floating_point() else x for x in bm.inputs(b)]
            out[b] = as_numpy(m(*xs)).astype(np.float64)
    return out


def bench_backend(backend, bm, ctx: Context, batches, ref, cold_runs: int) -> dict:
    row: dict = {"latency": {}}
    stage = "build"
    try:
        built = backend.build(bm, ctx)
        row.update(build_s=built.seconds, size_bytes=built.size_bytes)
        if built.extra.get("note"):
            row["note"] = built.extra["note"]
        stage = "load"
        fn = backend.load(built, bm, ctx)
        diffs = []
        for b in batches:
            stage = f"run batch {b}"
            xs = to_device(bm.inputs(b), ctx)
            with torch.no_grad():
                y = as_numpy(fn(*xs)).astype(np.float64)
            diffs.append(float(np.max(np.abs(y - ref[b]))))
            row["latency"][b] = time_calls(fn, xs, ctx.device)
        row["max_abs_diff_vs_fp64"] = max(diffs)
        if hasattr(backend, "activation_peak"):
            row["activation_peak_bytes"] = backend.activation_peak(built, bm, ctx, max(batches))
        stage = "cold start"
        npz = ctx.workdir / f"{bm.name}-inputs-{max(batches)}.npz"
        np.savez(npz, **{f"x{k}": x.numpy() for k, x in enumerate(bm.inputs(max(batches)))})
        row["cold_start"] = cold_start(backend.cold_start_code(built, bm, ctx, npz), cold_runs)
    except Exception as e:  # recorded, and the run goes on
        row["error"] = f"{stage}: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        row["traceback"] = traceback.format_exc()[-3000:]
    return row


def _bench_in_child(backend, model_name: str, ctx: Context, batches, ref, cold_runs: int) -> dict:
    torch.set_num_threads(ctx.threads)
    return bench_backend(backend, get(model_name), ctx, batches, ref, cold_runs)


def isolated(backend, model_name: str, ctx: Context, batches, ref, cold_runs: int) -> dict:
    """Each backend in a fresh process: thread pools that other backends left behind (torch's OpenMP team,
    ONNX Runtime's spinning workers) would otherwise take cores from the one being timed."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(_bench_in_child, backend, model_name, ctx, batches, ref, cold_runs).result()
        except Exception as e:  # the child died (a crash in native code): recorded, the run goes on
            return {"latency": {}, "error": f"process: {type(e).__name__}: {e}"}


def add_ratios(model_rows: dict) -> None:
    """Every speed figure also as a ratio to torch.compile (default mode) from the same run."""
    base = model_rows.get("torch.compile", {})
    for name, row in model_rows.items():
        for b, lat in row.get("latency", {}).items():
            ref = base.get("latency", {}).get(b)
            lat["ratio_to_compile"] = lat["median_ms"] / ref["median_ms"] if ref else None
        cs, ref_cs = row.get("cold_start"), base.get("cold_start")
        if cs and ref_cs:
            cs["ratio_to_compile"] = cs["median_s"] / ref_cs["median_s"]


def build_packages(suite: str, models: list[str] | None, out_dir: Path) -> None:
    """Build the suite's .tcpkg files here (a CPU-only machine will do) for a later run with --packages."""
    from .backends import Tcpkg, package_name

    cfg = SUITES[suite]
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, dtype, _ in cfg["runs"]:
        if models and name not in models:
            continue
        bm = get(name)
        ctx = Context(cfg["device"], 1, out_dir, dtype)
        try:
            built = Tcpkg().build(bm, ctx)
            print(f"{package_name(bm, ctx)}: {built.size_bytes} bytes in {built.seconds:.1f} s", file=sys.stderr)
        except Exception as e:  # recorded; the GPU run reports the missing package as that backend's error
            print(f"{package_name(bm, ctx)}: {type(e).__name__}: {e}", file=sys.stderr)


def run_suite(suite: str, threads: int, cold_runs: int, only: list[str] | None, out_dir: Path,
              models: list[str] | None = None, packages: Path | None = None, autotune: bool = False) -> Path:
    cfg = SUITES[suite]
    device = cfg["device"]
    torch.set_num_threads(threads)
    result = {"suite": suite, "machine": machine_name(device), "date": datetime.date.today().isoformat(),
              "device": device, "threads": threads, "cold_runs": cold_runs, "autotune": autotune,
              "versions": _versions(), "models": {}}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for name, dtype, batches in cfg["runs"]:
            if models and name not in models:
                continue
            bm = get(name)
            key = f"{name}/{str(dtype).split('.')[-1]}"
            ctx = Context(device, threads, Path(tmp), dtype, packages,
                          tuple(f"batch={b}" for b in batches) if autotune else ())
            print(f"[{key}] reference", file=sys.stderr, flush=True)
            ref = reference(bm, batches)
            rows = {}
            for backend in backends_for(device):
                if only and backend.name not in only:
                    continue
                print(f"[{key}] {backend.name}", file=sys.stderr, flush=True)
                rows[backend.name] = isolated(backend, name, ctx, batches, ref, cold_runs)
                if "error" in rows[backend.name]:
                    print(f"    error: {rows[backend.name]['error']}", file=sys.stderr)
            add_ratios(rows)
            result["models"][key] = {"batches": batches, "backends": rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{result['machine']}-{result['date']}-{suite}"
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    report.write_all(result, out_dir, stem)
    return path


def _versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("triton", "onnxruntime", "transformers", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = None
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=sorted(SUITES), default="cpu-quick")
    p.add_argument("--threads", type=int, default=None, help="threads for every backend (default: 2 on CPU)")
    p.add_argument("--cold-runs", type=int, default=3, help="fresh processes per cold-start figure")
    p.add_argument("--only", nargs="*", help="backend names to run (default: all)")
    p.add_argument("--models", nargs="*", help="model names to run (default: the whole suite)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--build-packages", type=Path, metavar="DIR",
                   help="only build the suite's .tcpkg files into DIR (run this on the CPU-only build machine)")
    p.add_argument("--packages", type=Path, metavar="DIR", help="use the .tcpkg files prebuilt in DIR")
    p.add_argument("--autotune", action="store_true", help="build tcpkg with --autotune at the suite's batches "
                   "(needs the GPU the suite runs on)")
    args = p.parse_args(argv)
    if args.build_packages:
        build_packages(args.suite, args.models, args.build_packages)
        return
    threads = args.threads or (min(os.cpu_count() or 1, 2) if SUITES[args.suite]["device"] == "cpu"
                               else os.cpu_count() or 1)
    path = run_suite(args.suite, threads, args.cold_runs, args.only, args.out, args.models, args.packages,
                     args.autotune)
    print(path)


if __name__ == "__main__":
    main()
