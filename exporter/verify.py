"""`--verify`: run a saved package in a fresh process where `import torch` fails, and compare with eager.

The cases are the example inputs, then every dynamic symbol at the ends of its range (the example's data
repeated or cut along each dynamic dim), so a package is checked where users will push it. A package with CPU
kernels runs on the CPU; a CUDA-only package runs on the GPU when there is one, and otherwise in Triton's CPU
interpreter (the same kernel source its cubins were built from; slow, so keep the shapes small).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from tcexport.formats import expr as ex
from tcexport.loader.archive import open_archive

from .model_file import ModelSpec

TOLERANCE = {"float32": (1e-4, 1e-3), "float64": (1e-10, 1e-8)}  # (atol, rtol)
MAX_CASE_SIZE = 4096  # a range end above this is tried at this size instead

RUNNER = r"""
import sys, json
sys.modules["torch"] = None  # the loader must work without torch: make `import torch` fail here
import numpy as np
import tcexport.loader as L
pkg, folder, n_cases = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = L.load(pkg, device=sys.argv[4])
for c in range(n_cases):
    inputs = [np.load(f"{folder}/case{c}_in{k}.npy") for k in range(len(model.inputs))]
    out = model(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    for k, o in enumerate(outs):
        np.save(f"{folder}/case{c}_out{k}.npy", o)
print(json.dumps({"torch_loaded": "torch" in sys.modules and sys.modules["torch"] is not None}))
"""


def _resize(a: np.ndarray, dim: int, size: int) -> np.ndarray:
    reps = -(-size // a.shape[dim])
    tiled = np.concatenate([a] * reps, axis=dim) if reps > 1 else a
    return np.take(tiled, np.arange(size), axis=dim)


def make_cases(spec: ModelSpec, manifest) -> list[tuple[str, list[np.ndarray]]]:
    base = [t.detach().cpu().numpy() for t in spec.example_inputs]
    cases = [("example", base)]
    env0 = {}
    for s, inp in zip(manifest.inputs, base):
        for d, dim in enumerate(s.shape):
            if isinstance(dim, str):
                env0.setdefault(dim, inp.shape[d])
    for sym in manifest.symbols:
        ends = [sym.min, min(sym.max if sym.max is not None else MAX_CASE_SIZE, MAX_CASE_SIZE)]
        for value in dict.fromkeys(ends):
            env = {**env0, sym.name: value}
            arrays = []
            for s, inp in zip(manifest.inputs, base):
                a = inp
                for d, dim in enumerate(s.shape):
                    if not isinstance(dim, int):
                        a = _resize(a, d, ex.evaluate(dim, env))
                arrays.append(np.ascontiguousarray(a))
            cases.append((f"{sym.name}={value}", arrays))
    return cases


def _eager(spec: ModelSpec, arrays) -> list[np.ndarray]:
    with torch.no_grad():
        out = spec.module(*[torch.from_numpy(a.copy()) for a in arrays])
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o.detach().numpy() for o in outs]


def verify(spec: ModelSpec, package: Path, quiet: bool = False) -> dict:
    manifest = open_archive(package).manifest
    cases = make_cases(spec, manifest)
    report = {"ok": True, "cases": []}
    with tempfile.TemporaryDirectory(prefix="tcexport-verify-") as tmp:
        expected = []
        for c, (_, arrays) in enumerate(cases):
            for k, a in enumerate(arrays):
                np.save(f"{tmp}/case{c}_in{k}.npy", a)
            expected.append(_eager(spec, arrays))
        where = _where(manifest)
        report["ran_on"] = where
        if where == "triton-interpreter":
            return _verify_interpreted(package, cases, expected, report, quiet)
        proc = subprocess.run([sys.executable, "-c", RUNNER, str(package), tmp, str(len(cases)), where],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            report.update(ok=False, error=proc.stderr.strip()[-4000:])
            if not quiet:
                print(f"verify: the torch-free run failed:\n{proc.stderr.strip()[-4000:]}", file=sys.stderr)
            return report
        report["torch_loaded_in_runner"] = json.loads(proc.stdout.strip().splitlines()[-1])["torch_loaded"]
        for c, (label, arrays) in enumerate(cases):
            for k, want in enumerate(expected[c]):
                got = np.load(f"{tmp}/case{c}_out{k}.npy")
                report["cases"].append(_compare(label, k, arrays, got, want))
    report["ok"] = all(c["ok"] for c in report["cases"])
    if not quiet:
        _print(report, cases, tmp_outputs=None)
    return report


def _where(manifest) -> str:
    if any(k.target == "cpu" for k in manifest.kernels):
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "triton-interpreter"


def _verify_interpreted(package: Path, cases, expected, report: dict, quiet: bool) -> dict:
    from .triton_interpret import run_interpreted

    try:
        outputs = run_interpreted(package, [arrays for _, arrays in cases])
    except Exception as e:  # noqa: BLE001 - any failure of the run is the verification's result
        report.update(ok=False, error=f"{type(e).__name__}: {e}")
        if not quiet:
            print(f"verify: the interpreted run failed: {report['error']}", file=sys.stderr)
        return report
    for (label, arrays), got, want in zip(cases, outputs, expected):
        for k, (g, w) in enumerate(zip(got, want)):
            report["cases"].append(_compare(label, k, arrays, g, w))
    report["ok"] = all(c["ok"] for c in report["cases"])
    if not quiet:
        print("verify: no CPU kernels and no GPU here; ran the CUDA kernels in Triton's interpreter",
              file=sys.stderr)
        _print(report, cases, tmp_outputs=None)
    return report


def _compare(label, k, arrays, got, want) -> dict:
    atol, rtol = TOLERANCE.get(str(want.dtype), (0, 0))
    same_shape = got.shape == want.shape
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if same_shape and got.size else 0.0
    ok = same_shape and got.dtype == want.dtype and bool(np.allclose(got, want, atol=atol, rtol=rtol, equal_nan=True))
    return {"case": label, "output": k, "input_shapes": [list(a.shape) for a in arrays],
            "shape": list(got.shape), "dtype": str(got.dtype), "max_abs_diff": diff, "ok": ok,
            "sample": got.reshape(-1)[:6].tolist()}


def _print(report, cases, tmp_outputs) -> None:
    print("verify (package run torch-free vs eager PyTorch):", file=sys.stderr)
    for c in report["cases"]:
        mark = "ok  " if c["ok"] else "FAIL"
        print(f"  {mark} {c['case']:<16} inputs {c['input_shapes']} -> output{c['output']} {c['shape']} "
              f"{c['dtype']}  max|diff| = {c['max_abs_diff']:.3g}", file=sys.stderr)
        print(f"       first values: {', '.join(f'{v:.6g}' for v in c['sample'])}", file=sys.stderr)
    print(f"verify: {'passed' if report['ok'] else 'FAILED'}", file=sys.stderr)
