"""`--verify`: run a saved package in a fresh process where `import torch` fails, and compare with eager.

The cases are the example inputs, then every dynamic symbol at the ends of its range (the example's data
repeated or cut along each dynamic dim), so a package is checked where users will push it. A package with CPU
kernels runs on the CPU; a CUDA-only package runs on the GPU when there is one, and otherwise in Triton's CPU
interpreter (the same kernel source its cubins were built from; slow, so keep the shapes small).

bfloat16 tensors cross as the loader's tagged uint16 bits (numpy has no bfloat16); ``.npy`` files drop the tag,
so the runner and the comparison put it back from the manifest's dtypes. Outputs are compared per dtype: floats
within a tolerance of eager, and a 16-bit float element that misses is still accepted when the package is at
least as close to a float64 run of the same model as eager is (eager rounds after every op, fused kernels keep
float32 between ops, so the two can sit a rounding or two apart on either side of the true value).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from tcexport.formats import expr as ex
from tcexport.loader.archive import open_archive
from tcexport.loader.arrays import to_numpy, to_torch
from tcexport.loader.dtypes import dtype_name, numpy_dtype

from tcexport.exporter.front.model_file import ModelSpec

# (atol, rtol); the 16-bit floats take torch.testing's defaults for them (rtol 1e-3 / 1.6e-2, atol 1e-5)
TOLERANCE = {"float32": (1e-4, 1e-3), "float64": (1e-10, 1e-8), "float16": (1e-5, 1e-3), "bfloat16": (1e-5, 1.6e-2)}
REFERENCED = ("float16", "bfloat16")  # dtypes whose misses are judged again against a float64 run
REF_FACTOR = 4.0  # the package may be this many times eager's own distance from the float64 result
MAX_CASE_SIZE = 4096  # a range end above this is tried at this size instead

RUNNER = r"""
import sys, json
sys.modules["torch"] = None  # the loader must work without torch: make `import torch` fail here
import numpy as np
import tcexport.loader as L
from tcexport.loader.dtypes import numpy_dtype
pkg, folder, n_cases = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = L.load(pkg, device=sys.argv[4])

def retag(a, dtype):  # .npy drops the bfloat16 tag of the uint16 bits; the manifest says which inputs have it
    return a.view(numpy_dtype(dtype)) if dtype == "bfloat16" and a.dtype == np.uint16 else a

for c in range(n_cases):
    inputs = [retag(np.load(f"{folder}/case{c}_in{k}.npy"), s.dtype) for k, s in enumerate(model.inputs)]
    out = model(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    for k, o in enumerate(outs):
        np.save(f"{folder}/case{c}_out{k}.npy", o if o.dtype.metadata is None else o.view(np.uint16))
print(json.dumps({"torch_loaded": "torch" in sys.modules and sys.modules["torch"] is not None}))
"""


def _resize(a: np.ndarray, dim: int, size: int) -> np.ndarray:
    """``a`` repeated or cut to ``size`` along ``dim``, in a's own dtype (np.concatenate drops the bf16 tag)."""
    reps = -(-size // a.shape[dim])
    tiled = np.concatenate([a] * reps, axis=dim) if reps > 1 else a
    return np.take(tiled, np.arange(size), axis=dim).view(a.dtype)


def _untag(a: np.ndarray) -> np.ndarray:
    """The plain uint16 bits of a tagged bfloat16 array (np.save warns on, and drops, dtype metadata)."""
    return a if a.dtype.metadata is None else a.view(np.uint16)


def _retag(a: np.ndarray, dtype: str) -> np.ndarray:
    """A loaded .npy as the loader's array for a manifest dtype: bfloat16 bits get their tag back."""
    return a.view(numpy_dtype(dtype)) if dtype == "bfloat16" and a.dtype == np.uint16 else a


def own_specs(manifest, which: str) -> list:
    """The manifest's ``inputs`` or ``outputs`` that callers pass and get: a state's are the loader's to keep."""
    state = {getattr(x, which[:-1]) for x in manifest.state}
    return [s for k, s in enumerate(getattr(manifest, which)) if k not in state]


def make_cases(spec: ModelSpec, manifest) -> list[tuple[str, list[np.ndarray]]]:
    """(label, input arrays): the example, then each symbol at the ends of its range. The state's inputs are
    the loader's to keep, not the caller's, so they are left out."""
    inputs = own_specs(manifest, "inputs")
    base = [to_numpy(t.detach().cpu(), s.name) for t, s in zip(spec.example_inputs, inputs)]
    cases = [("example", base)]
    env0 = {}
    for s, inp in zip(inputs, base):
        for d, dim in enumerate(s.shape):
            if isinstance(dim, str):
                env0.setdefault(dim, inp.shape[d])
    for sym in manifest.symbols:
        ends = [sym.min, min(sym.max if sym.max is not None else MAX_CASE_SIZE, MAX_CASE_SIZE)]
        for value in dict.fromkeys(ends):
            env = {**env0, sym.name: value}
            arrays = []
            for s, inp in zip(inputs, base):
                a = inp
                for d, dim in enumerate(s.shape):
                    if not isinstance(dim, int):
                        a = _resize(a, d, ex.evaluate(dim, env))
                arrays.append(np.ascontiguousarray(a))
            cases.append((f"{sym.name}={value}", arrays))
    return cases


def _eager(spec: ModelSpec, arrays) -> list[np.ndarray]:
    """The model's outputs on these inputs, as the loader would return them (bfloat16 as tagged bits)."""
    with torch.no_grad():
        out = spec.module(*[to_torch(a.copy()) for a in arrays])
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [to_numpy(o.detach(), f"output{k}").copy() for k, o in enumerate(outs)]


class _Reference:
    """The model run in float64 (module and float inputs), made only when a 16-bit float output misses eager's
    tolerance. None where the model cannot run in float64 (then the tolerance alone decides)."""

    def __init__(self, spec: ModelSpec):
        self.spec, self.module, self.failed, self.cache = spec, None, False, {}

    def outputs(self, case: str, arrays) -> list[np.ndarray] | None:
        if case not in self.cache:
            self.cache[case] = self._run(arrays)
        return self.cache[case]

    def _run(self, arrays) -> list[np.ndarray] | None:
        if self.failed:
            return None
        try:
            if self.module is None:
                self.module = copy.deepcopy(self.spec.module).double()
            with torch.no_grad():
                out = self.module(*[_double(to_torch(a.copy())) for a in arrays])
        except Exception:  # noqa: BLE001 - a model that cannot run in float64 is judged by the tolerance alone
            self.failed = True
            return None
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [o.detach().double().numpy() if o.is_floating_point() else None for o in outs]


def _double(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def verify(spec: ModelSpec, package: Path, quiet: bool = False) -> dict:
    manifest = open_archive(package).manifest
    cases = make_cases(spec, manifest)
    report = {"ok": True, "cases": []}
    with tempfile.TemporaryDirectory(prefix="tcexport-verify-") as tmp:
        expected = []
        for c, (_, arrays) in enumerate(cases):
            for k, a in enumerate(arrays):
                np.save(f"{tmp}/case{c}_in{k}.npy", _untag(a))
            expected.append(_eager(spec, arrays))
        where = where_to_run(manifest)
        report["ran_on"] = where
        if where == "triton-interpreter":
            return _verify_interpreted(spec, manifest, package, cases, expected, report, quiet)
        proc = subprocess.run([sys.executable, "-c", RUNNER, str(package), tmp, str(len(cases)), where],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            report.update(ok=False, error=proc.stderr.strip()[-4000:])
            if not quiet:
                print(f"verify: the torch-free run failed:\n{proc.stderr.strip()[-4000:]}", file=sys.stderr)
            return report
        report["torch_loaded_in_runner"] = json.loads(proc.stdout.strip().splitlines()[-1])["torch_loaded"]
        reference = _Reference(spec)
        outputs = own_specs(manifest, "outputs")
        for c, (label, arrays) in enumerate(cases):
            for k, want in enumerate(expected[c]):
                got = _retag(np.load(f"{tmp}/case{c}_out{k}.npy"), outputs[k].dtype)
                report["cases"].append(_compare(label, k, arrays, got, want, lambda: reference.outputs(label, arrays)))
    report["ok"] = all(c["ok"] for c in report["cases"])
    if not quiet:
        _print(report, cases, tmp_outputs=None)
    return report


def where_to_run(manifest) -> str:
    if any(k.target == "cpu" for k in manifest.kernels):
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "triton-interpreter"


def _verify_interpreted(spec: ModelSpec, manifest, package: Path, cases, expected, report: dict,
                        quiet: bool) -> dict:
    from tcexport.exporter.check.interpret import run_interpreted

    try:
        outputs = run_interpreted(package, [[_untag(a) for a in arrays] for _, arrays in cases])
    except Exception as e:  # noqa: BLE001 - any failure of the run is the verification's result
        report.update(ok=False, error=f"{type(e).__name__}: {e}")
        if not quiet:
            print(f"verify: the interpreted run failed: {report['error']}", file=sys.stderr)
        return report
    reference = _Reference(spec)
    specs = own_specs(manifest, "outputs")
    for (label, arrays), got, want in zip(cases, outputs, expected):
        for k, (g, w) in enumerate(zip(got, want)):
            g = _retag(g, specs[k].dtype)
            report["cases"].append(_compare(label, k, arrays, g, w, lambda: reference.outputs(label, arrays)))
    report["ok"] = all(c["ok"] for c in report["cases"])
    if not quiet:
        print("verify: no CPU kernels and no GPU here; ran the CUDA kernels in Triton's interpreter",
              file=sys.stderr)
        _print(report, cases, tmp_outputs=None)
    return report


def _compare(label, k, arrays, got, want, reference) -> dict:
    """One output against eager's: same shape and dtype, floats within the dtype's tolerance (16-bit floats may
    instead be as close to the float64 result as eager is; ``reference()`` gives it, made only when needed),
    everything else exactly."""
    dtype = dtype_name(want.dtype)
    same_shape = got.shape == want.shape
    g, w = _float64(got), _float64(want)
    diff = float(np.nanmax(np.abs(g - w))) if same_shape and got.size and np.isfinite(g - w).any() else 0.0
    ok = same_shape and dtype_name(got.dtype) == dtype and (
        _close(g, w, dtype, reference, k) if dtype in TOLERANCE else bool(np.array_equal(got, want)))
    return {"case": label, "output": k, "input_shapes": [list(a.shape) for a in arrays],
            "shape": list(got.shape), "dtype": dtype_name(got.dtype), "max_abs_diff": diff, "ok": ok,
            "sample": g.reshape(-1)[:6].tolist()}


def _close(got: np.ndarray, want: np.ndarray, dtype: str, reference, k: int) -> bool:
    atol, rtol = TOLERANCE[dtype]
    close = np.isclose(got, want, atol=atol, rtol=rtol, equal_nan=True)
    if close.all():
        return True
    if dtype not in REFERENCED:
        return False
    refs = reference()
    ref = refs[k] if refs is not None and k < len(refs) else None
    if ref is None or ref.shape != got.shape:
        return False
    ours, theirs = np.abs(got - ref), np.abs(want - ref)
    near = (ours <= REF_FACTOR * theirs + atol + rtol * np.abs(ref)) | (np.isnan(got) & np.isnan(ref))
    return bool((close | near).all())


def _float64(a: np.ndarray) -> np.ndarray:
    """An output as float64 for comparing and printing; bfloat16 bits widened by hand (numpy has no bfloat16)."""
    if dtype_name(a.dtype) == "bfloat16":
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def _print(report, cases, tmp_outputs) -> None:
    print("verify (package run torch-free vs eager PyTorch):", file=sys.stderr)
    for c in report["cases"]:
        mark = "ok  " if c["ok"] else "FAIL"
        print(f"  {mark} {c['case']:<16} inputs {c['input_shapes']} -> output{c['output']} {c['shape']} "
              f"{c['dtype']}  max|diff| = {c['max_abs_diff']:.3g}", file=sys.stderr)
        print(f"       first values: {', '.join(f'{v:.6g}' for v in c['sample'])}", file=sys.stderr)
    print(f"verify: {'passed' if report['ok'] else 'FAILED'}", file=sys.stderr)
