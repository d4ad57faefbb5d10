"""Export a zoo model and compare the package, run torch-free, with eager at each of its cases; the zoo's tests
and bench/zoo_table.py both go through here, so the table reports what the tests check. One comparison for every
place a package runs (``compare``'s ``device``): the CPU loader, the CUDA loader on a GPU, and the same CUDA
package's Triton kernels in Triton's interpreter on the CPU, which CI runs, so the GPU's path is the one CI
exercises."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

TOLERANCE = 2e-4
"""Largest |package - eager| allowed, relative to the output's largest magnitude (float32 through a few layers)."""

GPU_TOLERANCE = 2e-4
"""The same bound for the GPU's float32 Triton kernels (against eager float32 on the CPU): float32 GEMMs and
attention dots are full precision (``input_precision="ieee"``, exporter/cuda/gemm.py dot_kind; tf32 only multiplies
a float32 operand by a 16-bit one, which float32 models have none of), so what differs from the CPU is summation
order and the GPU's exp/rsqrt/division, each a few ulp: errors stay near 1e-6 (the CPU zoo's are 2e-7 to 2e-6),
far inside 2e-4, the float32 tolerance tests/test_cuda_gpu.py holds GPU packages to against float64. A tf32 GEMM
(11-bit mantissa, ~1e-3 relative) sneaking into a float32 path would fail it."""


@dataclass
class Exported:
    path: Path
    seconds: float
    size: int          # bytes of the .tcpkg


class Mismatch(AssertionError):
    """The package's output differs from eager's at one case: which, and by how much."""


class RangeNarrowed(AssertionError):
    """The package accepts less of a dynamic dim's range than the zoo declared, beyond the one known difference."""


def export_model(model, folder: Path, targets="cpu", cache_dir: Path | None = None, **kw) -> Exported:
    from tcexport.exporter import export

    module = model.build()
    example = model.inputs(model.example)
    t0 = time.perf_counter()
    pkg = export(module, example, model.dynamic_shapes(), targets, name=model.name, cache_dir=cache_dir, **kw)
    seconds = time.perf_counter() - t0
    tag = targets if isinstance(targets, str) else ",".join(targets)
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / f"{model.name}-{tag.replace(':', '_').replace(',', '_')}.tcpkg"
    pkg.save(path)
    return Exported(path, seconds, path.stat().st_size)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def relative_error(got, want: torch.Tensor) -> float:
    want = _numpy(want).astype(np.float64)
    got = np.asarray(got).astype(np.float64)
    if got.shape != want.shape:
        raise Mismatch(f"output shape {got.shape}, eager gives {want.shape}")
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-3)
    return float(np.abs(got - want).max(initial=0.0)) / scale


def run_package(path: Path, device: str, cases: list[list[np.ndarray]]) -> list[np.ndarray]:
    """The package's first output at each case (a list of input arrays): ``device`` "cpu" or "cuda" runs it
    through the loader (numpy in, numpy out; on "cuda" the loader copies each input to the GPU and the output
    back), "interpret" runs the CUDA package's kernels in Triton's interpreter (one subprocess for all cases)."""
    if device == "interpret":
        from tcexport.exporter.check.interpret import run_interpreted

        return [outs[0] for outs in run_interpreted(path, cases)]
    import tcexport.loader as L

    pkg = L.load(path, device=device)
    outs = [pkg(*inputs) for inputs in cases]
    return [got[0] if isinstance(got, tuple) else got for got in outs]


def compare(model, path: Path, cases: list[dict] | None = None, device: str = "cpu",
            tolerance: float = TOLERANCE) -> float:
    """Run the package (on ``device``: run_package) at every case and eager on the CPU on the same inputs;
    returns the largest relative error, raises ``Mismatch`` naming the case when one is over ``tolerance``."""
    cases = cases or model.cases()
    inputs = [model.inputs(sizes) for sizes in cases]
    got = run_package(path, device, [[_numpy(x) for x in xs] for xs in inputs])
    module = model.build()
    worst = 0.0
    for sizes, xs, out in zip(cases, inputs, got):
        with torch.no_grad():
            want = module(*xs)
        err = relative_error(out, want)
        if not err <= tolerance:
            raise Mismatch(f"{model.name} at {sizes} ({device}): max |package - eager| is {err:.2e} of the "
                           f"output's scale (allowed {tolerance:.0e})")
        worst = max(worst, err)
    return worst


def compare_cuda(model, path: Path, device: str = "cuda", cases: list[dict] | None = None) -> tuple[float, list[str]]:
    """A CUDA package against eager: on the GPU (``device`` "cuda": tests/zoo/test_zoo_gpu.py, bench/zoo_table.py
    --device cuda) or its kernels in Triton's interpreter ("interpret", at tiny ``cases``: test_zoo.py, in CI), the
    same steps either way. Returns the largest error and accepted_cases' notes."""
    cases, notes = accepted_cases(model, path, cases)
    return compare(model, path, cases, device=device, tolerance=GPU_TOLERANCE), notes


def accepted_cases(model, path: Path, cases: list[dict] | None = None) -> tuple[list[dict], list[str]]:
    """``cases`` (default ``model.cases()``) moved inside the ranges the package accepts, and a note per range
    export narrowed. Only the README's known difference may narrow one: torch before 2.13 (the GPU machine has 2.11) raises a
    grouped-query-attention model's ``seq`` minimum from 1 to 2; the cases then check the narrowed end. Any other
    narrowing raises ``RangeNarrowed``: a package that silently accepts less than declared is a failure."""
    from tcexport.loader.archive import open_archive

    # a symbol export rewrote (``seq = 4*_seq``) is not in the manifest under its name: its guards speak for it
    ranges = {s.name: (s.min, s.max) for s in open_archive(path).manifest.symbols if s.name in model.dims}
    notes = []
    for s, r in ranges.items():
        declared = tuple(model.dims[s])
        if r == declared:
            continue
        note = f"{s} {declared[0]}:{declared[1]} accepted as {r[0]}:{r[1]}"
        if not (s == "seq" and torch.__version__ < "2.13" and r == (2, declared[1]) and declared[0] == 1):
            raise RangeNarrowed(f"{model.name}: export narrowed {note} (torch {torch.__version__})")
        notes.append(note + f" (torch {torch.__version__}, README)")
    accepted = []
    for case in cases or model.cases():
        moved = {s: _clamp(v, *ranges.get(s, (None, None))) for s, v in case.items()}
        if moved not in accepted:
            accepted.append(moved)
    return accepted, notes


def _clamp(v: int, lo: int | None, hi: int | None) -> int:
    return min(max(v, lo if lo is not None else v), hi if hi is not None else v)
