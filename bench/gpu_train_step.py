"""One SGD training step on a GPU from a ``--backward`` package, against eager PyTorch and torch.compile, in one
process (CUDA events, median of 30 steps; float32): forward keeping what the backward needs, backward with unit
output gradients, and an in-place SGD update of every parameter (through ``parameters()`` for the package).
Also the saved activations' bytes against eager's (what autograd keeps alive between forward and backward).

    python -m bench.gpu_train_step                      # on a CUDA machine
    python -m bench.gpu_train_step --models mlp --work DIR   # the packages in DIR (default: a temporary folder)

Harness, not a probe: it measures what ships (a `--backward` package's training step), as bench/train_step.py does
on the CPU, with no option the product does not have. Results: bench/results/nvidia-h200-2026-11-29-train-step.md.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

import tcexport.loader as L
from tcexport.exporter.front.model_file import load_model_file
from tcexport.exporter.pipeline import export

ROOT = Path(__file__).resolve().parent.parent
CASES = {"mlp": (ROOT / "examples/mlp.py", [(64, 64), (512, 64)]),
         "decoder": (ROOT / "examples/decoder.py", [(8, 128)])}
LR = 1e-3


def timed(step, n: int = 30) -> float:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[n // 2]


def make_input(example: torch.Tensor, shape) -> torch.Tensor:
    if example.dtype.is_floating_point:
        return torch.randn(shape, device="cuda")
    return torch.randint(0, int(example.max()) + 1, shape, device="cuda")


def saved_bytes_eager(module, x) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--work", type=Path, help="folder for the packages (default: a fresh temporary folder)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="tcexport-train-"))
    work.mkdir(parents=True, exist_ok=True)
    arch = "cuda:sm_%d%d" % torch.cuda.get_device_capability()
    results = {}
    for name in args.models:
        path, shapes = CASES[name]
        spec = load_model_file(str(path))
        t0 = time.perf_counter()
        pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, arch, name=name, source_path=str(path),
                     backward=True)
        out = work / f"{name}-train.tcpkg"
        pkg.save(out)
        build_s = time.perf_counter() - t0
        model = L.load(out, device="cuda")
        params = model.parameters()
        eager = load_model_file(str(path)).module.cuda().train()
        compiled = torch.compile(load_model_file(str(path)).module.cuda().train())
        for shape in shapes:
            x = make_input(spec.example_inputs[0], shape)

            def tc_step():
                y, saved = model.forward(x, grad=True)
                grads = model.backward(saved, torch.ones_like(y))
                for k, p in params.items():
                    p.sub_(grads[k], alpha=LR)

            def torch_step(m):
                def step():
                    m.zero_grad(set_to_none=True)
                    y = m(x)
                    y.backward(torch.ones_like(y))
                    with torch.no_grad():
                        for p in m.parameters():
                            p.sub_(p.grad, alpha=LR)
                return step
            row = {"tcpkg_ms": timed(tc_step), "eager_ms": timed(torch_step(eager)),
                   "compile_ms": timed(torch_step(compiled)), "build_s": round(build_s, 1)}
            y, saved = model.forward(x, grad=True)
            row["saved_bytes"] = saved.nbytes
            row["eager_saved_bytes"] = saved_bytes_eager(eager, x)
            row["vs_compile"] = round(row["tcpkg_ms"] / row["compile_ms"], 2)
            row["vs_eager"] = round(row["tcpkg_ms"] / row["eager_ms"], 2)
            results[f"{name} {shape}"] = row
            print(name, shape, row, flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
