"""Training-step benchmark: one forward + backward (the gradients of every parameter) per step, eager PyTorch
vs torch.compile vs a `--backward` package run torch-free, and the memory each keeps for the backward.

    python -m bench.train_step                                  # mlp, cnn, decoder at two sizes each, 2 threads
    python -m bench.train_step --models mlp --threads 1
    python -m bench.train_step --build-packages pkgs/          # export only (e.g. on the build machine)
    python -m bench.train_step --packages pkgs/ --threads 2 4  # time prebuilt packages (no compiler needed)

Each backend runs in a fresh process of its own (the tcpkg one with ``import torch`` made to fail). Writes
bench/results/<machine>-<date>-train.json and .md. Columns:

- **step ms**: median (p10–p90) wall time of forward + backward with a fixed output gradient, after 3 warm-up
  steps, over at least 20 steps and 0.5 s. Eager and torch.compile also accumulate into ``.grad`` (set to None
  before each step); the package returns fresh gradient arrays.
- **saved KB**: what the forward keeps for the backward beyond weights, inputs and outputs. Eager: the bytes of
  the distinct storages autograd saves (``saved_tensors_hooks``), less weights, inputs and outputs. tcpkg: the
  saved activations of ``forward(..., grad=True)`` (``Saved.nbytes``). torch.compile keeps what its partitioner
  saves; it is not measured here.
- **build s**: torch.compile's first step (its compile); the package's export (capture, autograd, build).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
# (model, example file, sizes): sizes are the leading input dims (batch, or batch and sequence)
RUNS = [("mlp", "examples/mlp.py", [(64,), (512,)]),
        ("cnn", "examples/cnn.py", [(8,), (32,)]),
        ("decoder", "examples/decoder.py", [(4, 32), (8, 128)])]
BACKENDS = ("eager", "torch.compile", "tcpkg")


def _inputs(example: list, size: tuple, seed: int) -> list[np.ndarray]:
    """Inputs shaped like the model's example but with leading dims ``size`` (random, seeded)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in example:
        shape = tuple(size) + tuple(t.shape[len(size):])
        if t.dtype.kind == "f":
            out.append(rng.standard_normal(shape, dtype=np.float32))
        else:
            out.append(rng.integers(0, int(t.max()) + 1, shape).astype(t.dtype))
    return out


def _timed(step, min_steps: int = 20, min_seconds: float = 0.5) -> dict:
    for _ in range(3):
        step()
    times, start = [], time.perf_counter()
    while len(times) < min_steps or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(times, n=10)
    return {"step_ms": statistics.median(times), "p10": q[0], "p90": q[-1], "steps": len(times)}


# --- workers (one process each) ------------------------------------------------------------------------------


def _torch_worker(backend: str, model_file: str, folder: Path, threads: int) -> dict:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from packages import load_module

    torch.set_num_threads(threads)
    module = load_module(ROOT / model_file).model().eval()
    inputs = [torch.from_numpy(np.load(p)) for p in sorted(folder.glob("in*.npy"))]
    grad = torch.from_numpy(np.load(folder / "grad.npy"))
    result = {}
    if backend == "eager":
        result["saved_bytes"] = _eager_saved_bytes(module, inputs)
    fn = module
    if backend == "torch.compile":
        fn = torch.compile(module)
        t0 = time.perf_counter()
        fn(*inputs).backward(grad)
        result["build_s"] = time.perf_counter() - t0

    def step():
        for p in module.parameters():
            p.grad = None
        fn(*inputs).backward(grad)

    result.update(_timed(step))
    return result


def _eager_saved_bytes(module, inputs) -> int:
    import torch

    excluded = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers(), *inputs]}
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*inputs)
    excluded.add(out.untyped_storage().data_ptr())
    return sum(n for ptr, n in saved.items() if ptr not in excluded)


TCPKG_WORKER = r"""
import sys, json
sys.modules["torch"] = None  # the package trains torch-free
from pathlib import Path
import numpy as np
from bench.train_step import _timed  # the worker runs in the repository root
import tcexport.loader as L
folder = Path(sys.argv[2])
m = L.load(sys.argv[1], num_threads=int(sys.argv[3]))
inputs = [np.load(p) for p in sorted(folder.glob("in*.npy"))]
grad = np.load(folder / "grad.npy")
saved = m.forward(*inputs, grad=True)[1]
result = {"saved_bytes": saved.nbytes, "isa": m.isa}
del saved

def step():
    out, saved = m.forward(*inputs, grad=True)
    m.backward(saved, grad)

result.update(_timed(step))
print(json.dumps(result))
"""


# --- the parent ------------------------------------------------------------------------------------------------


def _run_worker(backend: str, model_file: str, folder: Path, threads: int, package: Path | None) -> dict:
    if backend == "tcpkg":
        cmd = [sys.executable, "-c", TCPKG_WORKER, str(package), str(folder), str(threads)]
    else:
        cmd = [sys.executable, "-m", "bench.train_step", "--worker", backend, model_file, str(folder),
               str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _export(model_file: str, out: Path) -> float:
    sys.path.insert(0, str(ROOT / "tests"))
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export

    spec = load_model_file(ROOT / model_file)
    t0 = time.perf_counter()
    export(spec.module, spec.example_inputs, spec.dynamic_shapes, name=Path(model_file).stem,
           source_path=str(ROOT / model_file), backward=True).save(out)
    return time.perf_counter() - t0


def build_packages(models: list[str], folder: Path) -> None:
    """Export each model with --backward into ``folder`` (NAME.tcpkg) and its export time (NAME.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, model_file, _ in RUNS:
        if name in models:
            seconds = _export(model_file, folder / f"{name}.tcpkg")
            (folder / f"{name}.json").write_text(json.dumps({"build_s": seconds}))


def run(models: list[str], threads: int, packages: Path | None = None) -> dict:
    import torch

    from tcexport.exporter.front.model_file import load_model_file

    rows = []
    with tempfile.TemporaryDirectory(prefix="tcexport-train-bench-") as tmp:
        for name, model_file, sizes in RUNS:
            if name not in models:
                continue
            if packages is None:
                package = Path(tmp) / f"{name}.tcpkg"
                export_s = _export(model_file, package)
            else:
                package = packages / f"{name}.tcpkg"
                export_s = json.loads((packages / f"{name}.json").read_text())["build_s"]
            spec = load_model_file(ROOT / model_file)
            example = [t.numpy() for t in spec.example_inputs]
            for size in sizes:
                folder = Path(tmp) / f"{name}-{'x'.join(map(str, size))}"
                folder.mkdir()
                inputs = _inputs(example, size, seed=sum(size))
                for k, x in enumerate(inputs):
                    np.save(folder / f"in{k}.npy", x)
                with torch.no_grad():
                    out = spec.module(*[torch.from_numpy(x) for x in inputs])
                np.save(folder / "grad.npy", np.random.default_rng(1).standard_normal(tuple(out.shape),
                                                                                       dtype=np.float32))
                row = {"model": name, "size": list(size), "backends": {}}
                for backend in BACKENDS:
                    result = _run_worker(backend, model_file, folder, threads, package)
                    if backend == "tcpkg":
                        result["build_s"] = export_s
                    row["backends"][backend] = result
                    print(f"{name} {size} {backend}: {result}", file=sys.stderr)
                rows.append(row)
    return {"threads": threads, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
            "cpus": os.cpu_count(), "rows": rows}


def markdown(report: dict) -> str:
    lines = [f"Training step (forward + backward of every parameter), {report['threads']} threads, torch "
             f"{report['torch']}, {report['date']}. Ratios: time / torch.compile's.", "",
             "| model | size | backend | step ms (p10–p90) | vs compile | saved KB | vs eager | build s |",
             "|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        b = row["backends"]
        compiled = b.get("torch.compile", {}).get("step_ms")
        eager_saved = b.get("eager", {}).get("saved_bytes")
        for backend, r in b.items():
            if "error" in r:
                lines.append(f"| {row['model']} | {row['size']} | {backend} | error: {r['error']} | | | | |")
                continue
            ratio = f"**{r['step_ms'] / compiled:.2f}**" if compiled else ""
            saved = f"{r['saved_bytes'] / 1024:.0f}" if "saved_bytes" in r else "–"
            vs_eager = f"{r['saved_bytes'] / eager_saved:.2f}" if "saved_bytes" in r and eager_saved else ""
            build = f"{r['build_s']:.1f}" if "build_s" in r else ""
            lines.append(f"| {row['model']} | {row['size']} | {backend} | {r['step_ms']:.3f} ({r['p10']:.3f}–"
                         f"{r['p90']:.3f}) | {ratio} | {saved} | {vs_eager} | {build} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=[r[0] for r in RUNS])
    parser.add_argument("--threads", type=int, nargs="*", default=[2])
    parser.add_argument("--build-packages", type=Path, help="only export the packages into this folder")
    parser.add_argument("--packages", type=Path, help="time the packages --build-packages wrote here")
    parser.add_argument("--worker", nargs=4, metavar=("BACKEND", "MODEL_FILE", "FOLDER", "THREADS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        backend, model_file, folder, threads = args.worker
        print(json.dumps(_torch_worker(backend, model_file, Path(folder), int(threads))))
        return
    if args.build_packages:
        build_packages(args.models, args.build_packages)
        return
    from .run import machine_name

    for threads in args.threads:
        report = run(args.models, threads, args.packages)
        RESULTS.mkdir(exist_ok=True)
        stem = RESULTS / f"{machine_name('cpu')}-{report['date']}-train-{threads}t"
        stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        stem.with_suffix(".md").write_text(markdown(report))
        print(markdown(report))


if __name__ == "__main__":
    main()
