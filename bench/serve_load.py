"""Load test of `tcpkg serve`: throughput and p50/p99 latency at 1, 8 and 64 concurrent clients, for the MLP and
the small decoder transformer, with and without dynamic batching, next to the same model behind ONNX Runtime in
the same server (the same app, repository and Batcher; only the model factory differs).

    python -m bench.serve_load                    # ~4 minutes on 2 cores
    python -m bench.serve_load --duration 2 --clients 1,8

Each server is a real subprocess on 127.0.0.1 (``python -m bench.serve_load --serve ...``); the clients are a
bounded asyncio loop (aiohttp): each client sends one request, waits for the answer, sends the next, for
``--duration`` seconds after a warm-up. A request is one row (the MLP: x float32[1, 64]; the decoder: ids
int64[1, 32]) with binary tensors both ways, as a latency-sensitive online service sends them. Writes
bench/results/<machine>-<date>-serve-load.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"mlp": ROOT / "examples" / "mlp.py", "decoder": ROOT / "examples" / "decoder.py"}
BACKENDS = ("tcpkg batched", "tcpkg unbatched", "onnxruntime batched", "onnxruntime unbatched")


# --- the ONNX Runtime model the server runs in the ORT rows ------------------------------------------------

class OrtModel:
    """An ONNX Runtime session with the package's manifest, so the server checks, batches and describes it
    exactly as the package (the package's guards run before ORT sees a request)."""

    def __init__(self, onnx_path: Path, manifest, threads: int):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        self.manifest = manifest
        self.names = [i.name for i in self.session.get_inputs()]
        self.single = manifest.output_structure == "single"

    def __call__(self, *xs):
        outs = self.session.run(None, dict(zip(self.names, xs)))
        return outs[0] if self.single else tuple(outs)


def load_ort(path: Path, options):
    """The server's model factory for ORT: ``path`` is the package; its ONNX file lies beside it."""
    from tcexport.loader import open_archive

    return OrtModel(path.with_suffix(".onnx"), open_archive(path).manifest, options.num_threads or 1)


def serve_main(args) -> int:
    from tcexport.serving.repository import LoadOptions
    from tcexport.serving.server import ServeConfig, serve

    # without batching: every request is its own call (--max-batch 1), still on the model's one runner
    options = LoadOptions(max_batch=args.max_batch if args.batching == "on" else 1, max_delay_ms=args.max_delay_ms,
                          num_threads=args.threads)
    config = ServeConfig((args.serve,), options, port=args.port, log_level="warning")
    return serve(config, load_model=load_ort if args.backend == "onnxruntime" else None)


# --- building the packages and ONNX files ----------------------------------------------------------------

def build(name: str, out: Path) -> Path:
    """``out/<name>.tcpkg`` and ``out/<name>.onnx`` (torch.onnx, as bench/backends.py's ONNX Runtime backend)."""
    from tcexport.exporter.check.onnx import export_onnx_bytes, write_onnx
    from tcexport.exporter.front.dynamic import SymbolSpec, to_torch_dynamic_shapes
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export

    pkg = out / f"{name}.tcpkg"
    spec = load_model_file(str(MODELS[name]))
    if not pkg.is_file():
        export(spec.module, spec.example_inputs, spec.dynamic_shapes, name=name,
               source_path=str(MODELS[name])).save(pkg)
    onnx = pkg.with_suffix(".onnx")
    if not onnx.is_file():
        dyn = spec.dynamic_shapes
        symbols = {s: SymbolSpec(s, lo, hi) for d in dyn.values() for s, lo, hi in d.values()}
        places = {n: {k: s for k, (s, _, _) in d.items()} for n, d in dyn.items()}
        shapes = to_torch_dynamic_shapes(spec.input_names, spec.example_inputs, symbols, places)
        write_onnx(export_onnx_bytes(spec, shapes)[0], onnx)
    return pkg


def request_body(name: str, rng) -> tuple[bytes, dict]:
    if name == "mlp":
        x, datatype = rng.standard_normal((1, 64)).astype(np.float32), "FP32"
    else:
        x, datatype = rng.integers(0, 256, size=(1, 32)).astype(np.int64), "INT64"
    input_name = "x" if name == "mlp" else "ids"
    header = json.dumps({"inputs": [{"name": input_name, "shape": list(x.shape), "datatype": datatype,
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"}


# --- the load generator -------------------------------------------------------------------------------------

async def load(url: str, body: bytes, headers: dict, clients: int, seconds: float, warmup: float) -> dict:
    """``clients`` closed-loop clients for ``warmup + seconds``; latencies of the requests sent after the warm-up.
    aiohttp, not httpx: httpx's connection pool itself became the bottleneck past ~8 concurrent clients (64
    clients got ~30 requests/s through it where aiohttp gets the server's ~1000 on the same machine)."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        start = time.perf_counter()
        measure_from, stop = start + warmup, start + warmup + seconds

        async def client():
            nonlocal errors
            while (t0 := time.perf_counter()) < stop:
                async with session.post(url + "/infer", data=body, headers=headers) as r:
                    await r.read()
                    ok = r.status == 200
                t1 = time.perf_counter()
                if not ok:
                    errors += 1
                elif t0 >= measure_from:
                    latencies.append(t1 - t0)
        await asyncio.gather(*(client() for _ in range(clients)))
    lat = np.array(latencies) * 1e3
    return {"clients": clients, "requests": len(lat), "errors": errors, "throughput_rps": len(lat) / seconds,
            "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
            "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(pkg: Path, backend: str, batching: str, args) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "bench.serve_load", "--serve", str(pkg), "--backend", backend, "--batching",
           batching, "--port", str(port), "--threads", str(args.threads), "--max-batch", str(args.max_batch),
           "--max-delay-ms", str(args.max_delay_ms)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read().decode(errors="replace")[-600:])
        try:
            if httpx.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                return proc, f"{url}/v2/models/{pkg.stem}"
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server not ready after 60 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_backend(name: str, pkg: Path, backend: str, args) -> dict:
    kind, batching = backend.split()
    proc, url = start_server(pkg, "tcpkg" if kind == "tcpkg" else "onnxruntime",
                             "on" if batching == "batched" else "off", args)
    try:
        body, headers = request_body(name, np.random.default_rng(0))
        rows = [asyncio.run(load(url, body, headers, c, args.duration, args.warmup)) for c in args.clients]
        return {"rows": rows}
    finally:
        stop_server(proc)


# --- the report -------------------------------------------------------------------------------------------

def markdown(result: dict) -> str:
    lines = [f"# Serving load test on {result['machine']} ({result['date']})", "",
             f"`tcpkg serve` (one worker, {result['threads']} model thread(s), --max-batch {result['max_batch']}, "
             f"--max-delay-ms {result['max_delay_ms']}); clients: closed-loop asyncio aiohttp on the same machine, "
             f"{result['duration_s']} s per cell after {result['warmup_s']} s warm-up; one row per request, binary "
             f"tensors. ONNX Runtime runs in the same app (same guards, Batcher, HTTP path). Throughput in "
             f"requests/s, latency p50 / p99 in ms.", ""]
    for name, model in result["models"].items():
        clients = result["clients"]
        head = ["backend"] + [f"{c} client(s): req/s, p50 / p99 ms" for c in clients]
        lines += [f"## {name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for backend, row in model.items():
            if "error" in row:
                lines.append(f"| {backend} | failed: {row['error'][:120]} |" + " |" * (len(head) - 2))
                continue
            cells = [backend] + [f"{r['throughput_rps']:.0f}, {r['p50_ms']:.2f} / {r['p99_ms']:.2f}"
                                 + (f" ({r['errors']} errors)" if r["errors"] else "")
                                 if r["p50_ms"] is not None else "no answers" for r in row["rows"]]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["models"])
    fig, axes = plt.subplots(2, len(names), figsize=(6 * len(names), 8), squeeze=False)
    for j, name in enumerate(names):
        for backend, row in result["models"][name].items():
            label = backend if "error" not in row else f"{backend} (failed)"
            if "error" in row:
                axes[0][j].plot([], [], label=label)
                continue
            cs = [r["clients"] for r in row["rows"]]
            axes[0][j].plot(cs, [r["throughput_rps"] for r in row["rows"]], "o-", label=label)
            axes[1][j].plot(cs, [r["p99_ms"] or 0 for r in row["rows"]], "o-", label=label)
        axes[0][j].set(title=f"{name}: throughput", xlabel="concurrent clients", ylabel="requests/s")
        axes[1][j].set(title=f"{name}: p99 latency", xlabel="concurrent clients", ylabel="ms")
        for ax in axes[:, j]:
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=8)
            ax.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def machine_name() -> str:
    cpu = "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = "-".join(line.split(":", 1)[1].lower().split()[:2])
                break
    except OSError:
        pass
    return f"{os.cpu_count()}core-{cpu}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,decoder")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--clients", default="1,8,64")
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1, help="model threads in the server (default 1)")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--max-delay-ms", type=float, default=0.0)
    p.add_argument("--work", type=Path, default=ROOT / "bench" / ".serve-load")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    # the server side (a subprocess this script starts)
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="tcpkg", help=argparse.SUPPRESS)
    p.add_argument("--batching", default="on", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve_main(args)
    args.clients = [int(c) for c in args.clients.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine_name(), "date": datetime.date.today().isoformat(), "threads": args.threads,
              "max_batch": args.max_batch, "max_delay_ms": args.max_delay_ms, "duration_s": args.duration,
              "warmup_s": args.warmup, "clients": args.clients, "models": {}}
    t0 = time.perf_counter()
    for name in args.models.split(","):
        pkg = build(name, args.work)
        result["models"][name] = {}
        for backend in args.backends.split(","):
            try:
                result["models"][name][backend] = run_backend(name, pkg, backend, args)
            except Exception as e:
                result["models"][name][backend] = {"error": f"{type(e).__name__}: {e}"}
            print(name, backend, json.dumps(result["models"][name][backend]), flush=True)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    stem = args.out / f"{result['machine']}-{result['date']}-serve-load"
    args.out.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(markdown(result))
    plot(result, stem.with_suffix(".png"))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
