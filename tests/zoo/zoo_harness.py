"""Export a zoo model and compare the package, run torch-free, with eager at each of its cases; the zoo's tests
and bench/zoo_table.py both go through here, so the table reports what the tests check."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

TOLERANCE = 2e-4
"""Largest |package - eager| allowed, relative to the output's largest magnitude (float32 through a few layers)."""


@dataclass
class Exported:
    path: Path
    seconds: float
    size: int          # bytes of the .tcpkg


class Mismatch(AssertionError):
    """The package's output differs from eager's at one case: which, and by how much."""


def export_model(model, folder: Path, targets="cpu", cache_dir: Path | None = None, **kw) -> Exported:
    from tcexport.exporter import export

    module = model.build()
    example = model.inputs(model.example)
    t0 = time.perf_counter()
    pkg = export(module, example, model.dynamic_shapes(), targets, name=model.name, cache_dir=cache_dir, **kw)
    seconds = time.perf_counter() - t0
    tag = targets if isinstance(targets, str) else ",".join(targets)
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


def compare(model, path: Path, cases: list[dict] | None = None) -> float:
    """Run the package at every case and eager on the same inputs; returns the largest relative error, raises
    ``Mismatch`` naming the case when one is over ``TOLERANCE``."""
    import tcexport.loader as L

    pkg = L.load(path)
    module = model.build()
    worst = 0.0
    for sizes in cases or model.cases():
        inputs = model.inputs(sizes)
        with torch.no_grad():
            want = module(*inputs)
        got = pkg(*[_numpy(x) for x in inputs])
        err = relative_error(got[0] if isinstance(got, tuple) else got, want)
        if not err <= TOLERANCE:
            raise Mismatch(f"{model.name} at {sizes}: max |package - eager| is {err:.2e} of the output's scale "
                           f"(allowed {TOLERANCE:.0e})")
        worst = max(worst, err)
    return worst
