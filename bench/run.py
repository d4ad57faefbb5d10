"""Run a benchmark suite: every backend on the same models, inputs and threads, in one run.

    python -m bench.run --suite cpu-quick            # a few minutes on 2 cores
    python -m bench.run --suite gpu                  # on a CUDA machine
    python -m bench.run --suite gpu-gpt2-bf16 --cold-runs 1   # GPT-2 small bf16 only (about 5 minutes)
    python -m bench.run --suite gpu-gpt2-bf16 --autotune      # the same, tcpkg built with --autotune
    python -m bench.run --suite cpu-zoo              # 14 models x 6 backends, floors, concurrency (hours: README)
    python -m bench.run --suite gpu-zoo --precision bf16      # the GPU zoo under AMP (torch.autocast / --precision)

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import concurrency, report, zoo
from .backends import AMP_DTYPES, Context, as_numpy, backends_for, not_measured, precision_label, to_device
from .floors import machine_peaks
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
    # issue 18: the model suite (zoo.py) at batch 1 and a serving batch, floors, geomeans, a plot per family.
    # Fewer, longer samples than the small suites: a ViT-B/16 call at batch 8 takes a second on 2 cores.
    "cpu-zoo": {"device": "cpu", "runs": [(n, torch.float32, b) for n, b in zoo.CPU], "zoo": True,
                "concurrency": ["gpt2", "bert-base", "resnet50"],
                "timing": {"warmup": 2, "min_calls": 10, "min_seconds": 1.0, "max_seconds": 20.0}},
    "gpu-zoo": {"device": "cuda", "runs": [(n, torch.bfloat16, b) for n, b in zoo.GPU], "zoo": True,
                "timing": {"warmup": 5, "min_calls": 30, "min_seconds": 0.5, "max_seconds": 10.0}},
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
               max_calls: int = 2000, max_seconds: float = float("inf")) -> dict:
    """Warm up, then time single calls until enough samples; CUDA events on GPU. Past ``max_seconds`` it stops
    once it has 5 calls (a slow model at a large batch gets fewer samples, not an hour)."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(*xs)
        if device == "cuda":
            torch.cuda.synchronize()
        times = []
        start = time.perf_counter()
        while ((len(times) < min_calls or time.perf_counter() - start < min_seconds) and len(times) < max_calls
               and not (len(times) >= 5 and time.perf_counter() - start > max_seconds)):
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


# accuracy: the largest |output - fp64 reference| over the largest |reference|, flagged past this (16 bits: a few
# units of the format's epsilon, grown over a dozen layers; float32 is far inside its bound)
REL_TOLERANCE = {"float32": 1e-3, "bfloat16": 6e-2, "float16": 1.5e-2}


def reference(bm, batches, peaks: dict | None = None, element_size: int = 4) -> tuple[dict, dict]:
    """Eager PyTorch in float64 on the CPU (attention through the math kernel): what every backend's output is
    compared with. The same forward counts the model's FLOPs for the floors (floors.py) when ``peaks`` is given."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .floors import count_flops, floor_ms, weight_bytes

    m = bm.build().double()
    out, floors = {}, {}
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        for b in batches:
            xs = [x.double() if x.is_floating_point() else x for x in bm.inputs(b)]
            flops, y = count_flops(m, xs)
            out[b] = as_numpy(y).astype(np.float64)
            if peaks:
                inputs = sum(x.numel() * (element_size if x.is_floating_point() else x.element_size()) for x in xs)
                nbytes = weight_bytes(m, element_size) + inputs + out[b].size * element_size
                floors[b] = floor_ms(flops, nbytes, peaks)
    return out, floors


def bench_backend(backend, bm, ctx: Context, batches, ref, cold_runs: int) -> dict:
    """One backend on one model: build, load, check against ``ref`` ({"b<batch>": fp64 output}), time each batch,
    then the concurrency row and the cold start where the run asks for them. A failing stage is recorded."""
    row: dict = {"latency": {}}
    stage = "build"
    try:
        built = backend.build(bm, ctx)
        row.update(build_s=built.seconds, size_bytes=built.size_bytes)
        if built.extra.get("note"):
            row["note"] = built.extra["note"]
        stage = "load"
        fn = backend.load(built, bm, ctx)
        diffs, rels = [], []
        for b in batches:
            stage = f"run batch {b}"
            xs = to_device(bm.inputs(b), ctx)
            with torch.no_grad():
                y = as_numpy(fn(*xs)).astype(np.float64)
            want = ref[f"b{b}"]
            diffs.append(float(np.max(np.abs(y - want))))
            rels.append(diffs[-1] / max(float(np.max(np.abs(want))), 1e-30))
            row["latency"][b] = time_calls(fn, xs, ctx.device, **ctx.timing)
        row["max_abs_diff_vs_fp64"] = max(diffs)
        row["max_rel_diff_vs_fp64"] = max(rels)
        tol = REL_TOLERANCE[str(AMP_DTYPES[ctx.precision] if ctx.precision else ctx.dtype).split(".")[-1]]
        row["accuracy"] = {"tolerance_rel": tol, "ok": max(rels) <= tol}
        if hasattr(backend, "activation_peak"):
            row["activation_peak_bytes"] = backend.activation_peak(built, bm, ctx, max(batches))
        if ctx.concurrency and backend.name in concurrency.BACKENDS:
            stage = "concurrency"
            try:  # a failure here leaves the latency figures standing
                xs = to_device(bm.inputs(min(batches)), ctx)
                row["concurrency"] = {"batch": min(batches), **concurrency.throughput(
                    fn, xs, ctx.concurrency, ctx.concurrency_seconds)}
            except Exception as e:
                row["concurrency"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        if cold_runs > 0:
            stage = "cold start"
            npz = ctx.workdir / f"{bm.name}-inputs-{max(batches)}.npz"
            np.savez(npz, **{f"x{k}": x.numpy() for k, x in enumerate(bm.inputs(max(batches)))})
            row["cold_start"] = cold_start(backend.cold_start_code(built, bm, ctx, npz), cold_runs)
    except Exception as e:  # recorded, and the run goes on
        row["error"] = f"{stage}: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        row["traceback"] = traceback.format_exc()[-3000:]
    return row


def _bench_in_child(backend, model_name: str, ctx: Context, batches, ref_path: Path, cold_runs: int) -> dict:
    torch.set_num_threads(ctx.threads)
    with np.load(ref_path) as ref:
        return bench_backend(backend, get(model_name), ctx, batches, ref, cold_runs)


def isolated(backend, model_name: str, ctx: Context, batches, ref_path: Path, cold_runs: int,
             minutes: float = 60.0) -> dict:
    """Each backend in a fresh process with a deadline (isolate.py says why)."""
    from .isolate import run_isolated

    return run_isolated(_bench_in_child, (backend, model_name, ctx, batches, ref_path, cold_runs), minutes * 60)


def _bases(model_rows: dict, device: str) -> dict:
    """What each latency is divided by: {label: {batch: median ms}}. torch.compile (default mode) always; on the
    CPU also the faster of ONNX Runtime and OpenVINO at each batch, on the GPU torch.compile(reduce-overhead)."""
    def medians(*names):
        out = {}
        for name in names:
            for b, lat in model_rows.get(name, {}).get("latency", {}).items():
                out[b] = min(out.get(b, float("inf")), lat["median_ms"])
        return out
    bases = {"torch.compile": medians("torch.compile")}
    if device == "cuda":
        bases["torch.compile(reduce-overhead)"] = medians("torch.compile(reduce-overhead)")
    else:
        bases["best of onnxruntime/openvino"] = medians("onnxruntime", "openvino")
    return bases


def add_ratios(model_rows: dict, device: str = "cpu", floors: dict | None = None) -> None:
    """Every speed figure also as a ratio to each base from the same run, and to the model's floor."""
    base = model_rows.get("torch.compile", {})
    bases = _bases(model_rows, device)
    for name, row in model_rows.items():
        for b, lat in row.get("latency", {}).items():
            ref = base.get("latency", {}).get(b)
            lat["ratio_to_compile"] = lat["median_ms"] / ref["median_ms"] if ref else None
            lat["ratios"] = {label: lat["median_ms"] / ms[b] if b in ms else None for label, ms in bases.items()}
            fl = (floors or {}).get(b)
            if fl:
                lat["x_floor"] = lat["median_ms"] / max(fl["arith_ms"], fl["memory_ms"])
        cs, ref_cs = row.get("cold_start"), base.get("cold_start")
        if cs and ref_cs:
            cs["ratio_to_compile"] = cs["median_s"] / ref_cs["median_s"]


@dataclass
class Options:
    """One suite run, as the command line gave it."""
    suite: str
    threads: int
    cold_runs: int
    out_dir: Path = RESULTS
    only: list | None = None
    models: list | None = None
    packages: Path | None = None
    autotune: bool = False
    precision: str | None = None           # "bf16"/"fp16": AMP (the float32 model under autocast)
    dtype: torch.dtype | None = None       # every run at this dtype instead of the suite's
    batches: list | None = None            # every run at these batches instead of the suite's
    max_minutes: float = 30.0              # per (model, backend) process
    max_autotune_minutes: float = 15.0     # per model, for torch.compile(max-autotune)
    concurrency_models: list | None = None  # None: the suite's
    callers: tuple = (1, 2, 4)
    concurrency_seconds: float = 5.0


def planned_runs(opts: Options) -> list[tuple[str, torch.dtype, list]]:
    """The suite's (model, dtype, batches) after --models, --dtype, --precision and --batches."""
    runs = []
    for name, dtype, batches in SUITES[opts.suite]["runs"]:
        if opts.models and name not in opts.models:
            continue
        dtype = torch.float32 if opts.precision else (opts.dtype or dtype)
        runs.append((name, dtype, list(opts.batches or batches)))
    return runs


def build_packages(opts: Options, out_dir: Path) -> None:
    """Build the suite's .tcpkg files here (a CPU-only machine will do) for a later run with --packages."""
    from .backends import Tcpkg, package_name

    device = SUITES[opts.suite]["device"]
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, dtype, _ in planned_runs(opts):
        bm = get(name)
        ctx = Context(device, 1, out_dir, dtype, precision=opts.precision)
        try:
            built = Tcpkg().build(bm, ctx)
            print(f"{package_name(bm, ctx)}: {built.size_bytes} bytes in {built.seconds:.1f} s", file=sys.stderr)
        except Exception as e:  # recorded; the GPU run reports the missing package as that backend's error
            print(f"{package_name(bm, ctx)}: {type(e).__name__}: {e}", file=sys.stderr)


def results_stem(result: dict, opts: Options) -> str:
    stem = f"{result['machine']}-{result['date']}-{opts.suite}"
    if opts.dtype is not None and not opts.precision:
        stem += f"-{str(opts.dtype).split('.')[-1]}"
    return stem + (f"-amp-{opts.precision}" if opts.precision else "")


def _bench_model(opts: Options, result: dict, tmp: Path, name: str, dtype, batches, peaks) -> None:
    cfg = SUITES[opts.suite]
    device = cfg["device"]
    bm = get(name)
    conc = opts.concurrency_models if opts.concurrency_models is not None else cfg.get("concurrency", [])
    ctx = Context(device, opts.threads, tmp, dtype, opts.packages,
                  tuple(f"batch={b}" for b in batches) if opts.autotune else (), opts.precision,
                  timing=cfg.get("timing", {}), concurrency=tuple(opts.callers) if name in conc else (),
                  concurrency_seconds=opts.concurrency_seconds)
    key = f"{name}/{precision_label(ctx)}"
    print(f"[{key}] reference", file=sys.stderr, flush=True)
    elem = 2 if opts.precision else torch.empty((), dtype=dtype).element_size()
    ref, floors = reference(bm, batches, peaks, elem)
    ref_path = tmp / f"{name}-reference.npz"
    np.savez(ref_path, **{f"b{b}": v for b, v in ref.items()})
    del ref
    rows = {}
    for backend in backends_for(device, zoo=bool(cfg.get("zoo"))):
        if opts.only and backend.name not in opts.only:
            continue
        if not_measured(backend, ctx):
            rows[backend.name] = {"latency": {}, "skipped": not_measured(backend, ctx)}
            continue
        print(f"[{key}] {backend.name}", file=sys.stderr, flush=True)
        minutes = opts.max_autotune_minutes if "max-autotune" in backend.name else opts.max_minutes
        rows[backend.name] = isolated(backend, name, ctx, batches, ref_path, opts.cold_runs, minutes)
        if "error" in rows[backend.name]:
            print(f"    error: {rows[backend.name]['error']}", file=sys.stderr)
    add_ratios(rows, device, floors)
    result["models"][key] = {"batches": batches, "backends": rows, "family": bm.family, "floors": floors}


def run_suite(opts: Options) -> Path:
    cfg = SUITES[opts.suite]
    device = cfg["device"]
    torch.set_num_threads(opts.threads)
    result = {"suite": opts.suite, "machine": machine_name(device), "date": datetime.date.today().isoformat(),
              "device": device, "threads": opts.threads, "cold_runs": opts.cold_runs, "autotune": opts.autotune,
              "precision": opts.precision, "zoo": bool(cfg.get("zoo")), "versions": _versions(), "models": {}}
    runs = planned_runs(opts)
    if cfg.get("zoo") and runs:  # the floors' peaks, measured first, on a machine nothing else of ours is using
        gemm_dtype = AMP_DTYPES[opts.precision] if opts.precision else runs[0][1]
        print(f"[peaks] {str(gemm_dtype).split('.')[-1]} GEMM and copy bandwidth", file=sys.stderr, flush=True)
        result["peaks"] = machine_peaks(device, gemm_dtype, opts.threads)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for name, dtype, batches in runs:
            _bench_model(opts, result, Path(tmp), name, dtype, batches, result.get("peaks"))
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    stem = results_stem(result, opts)
    path = opts.out_dir / f"{stem}.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    report.write_all(result, opts.out_dir, stem)
    return path


def _versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("triton", "onnxruntime", "openvino", "transformers", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = None
    return out


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=sorted(SUITES), default="cpu-quick")
    p.add_argument("--threads", type=int, default=None, help="threads for every backend (default: 2 on CPU)")
    p.add_argument("--cold-runs", type=int, default=None, help="fresh processes per cold-start figure; 0 skips "
                   "cold starts (default: 3, and 0 for the zoo suites)")
    p.add_argument("--only", nargs="*", help="backend names to run (default: all)")
    p.add_argument("--models", nargs="*", help="model names to run (default: the whole suite)")
    p.add_argument("--batches", nargs="*", type=int, help="batch sizes for every model (default: the suite's)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--build-packages", type=Path, metavar="DIR",
                   help="only build the suite's .tcpkg files into DIR (run this on the CPU-only build machine)")
    p.add_argument("--packages", type=Path, metavar="DIR", help="use the .tcpkg files prebuilt in DIR")
    p.add_argument("--autotune", action="store_true", help="build tcpkg with --autotune at the suite's batches "
                   "(needs the GPU the suite runs on)")
    p.add_argument("--precision", choices=sorted(AMP_DTYPES), help="AMP: the float32 model under torch.autocast "
                   "at this dtype (tcpkg: export(precision=...)); results stem gets -amp-<precision>")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="every model cast to this dtype (default: the suite's; "
                   "gpu-zoo runs bfloat16, the CPU suites float32)")
    p.add_argument("--max-minutes-per-backend", type=float, default=30.0, help="a (model, backend) process "
                   "still running after this is killed and its row says timeout (default 30)")
    p.add_argument("--max-autotune-minutes", type=float, default=15.0, help="the same for "
                   "torch.compile(max-autotune), which the GPU zoo runs where it finishes within this (default 15)")
    p.add_argument("--concurrency-models", nargs="*", help="models with a concurrency row (default: the suite's; "
                   "cpu-zoo: gpt2 bert-base resnet50); give none to skip the row")
    p.add_argument("--callers", nargs="*", type=int, default=[1, 2, 4], help="calling threads in the concurrency row")
    p.add_argument("--concurrency-seconds", type=float, default=5.0, help="how long each caller count runs")
    return p


def main(argv=None) -> None:
    p = _parser()
    args = p.parse_args(argv)
    cfg = SUITES[args.suite]
    if args.precision and args.dtype:
        p.error("--precision runs the float32 model under autocast; it takes no --dtype")
    threads = args.threads or (min(os.cpu_count() or 1, 2) if cfg["device"] == "cpu" else os.cpu_count() or 1)
    cold_runs = args.cold_runs if args.cold_runs is not None else (0 if cfg.get("zoo") else 3)
    opts = Options(args.suite, threads, cold_runs, args.out, args.only, args.models, args.packages, args.autotune,
                   args.precision, DTYPES[args.dtype] if args.dtype else None, args.batches,
                   args.max_minutes_per_backend, args.max_autotune_minutes, args.concurrency_models,
                   tuple(args.callers), args.concurrency_seconds)
    if args.models:
        known = {name for name, _, _ in cfg["runs"]}
        if not set(args.models) <= known:
            p.error(f"--models {sorted(set(args.models) - known)} are not in suite {args.suite}: {sorted(known)}")
    if args.build_packages:
        build_packages(opts, args.build_packages)
        return
    print(run_suite(opts))


if __name__ == "__main__":
    main()
