"""`--verify` for a package with methods: its methods run torch-free in one session, compared with eager.

A method's meaning depends on the state the others leave (prefill fills the cache decode reads), so the methods run
as a user calls them: each at its example inputs, in the package's order (forward first, the others as declared),
one session on both sides, and the state both sides hold afterwards is compared too. A package without state has no
order to keep, so each method is also tried at the ends of its symbols' ranges (verify.py's cases, per method).
Eager runs on a copy of the model, so the model file's module keeps the state it had. Outputs are compared as
verify.py compares them; a 16-bit float miss is judged against a float64 run of the same sequence, made only when
one misses.
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

from tcexport.loader.archive import open_archive
from tcexport.loader.arrays import to_numpy, to_torch

from tcexport.exporter.check.verify import (_compare, _double, _print, _retag, _untag, make_cases, own_specs,
                                            where_to_run)
from tcexport.exporter.front.model_file import ModelSpec

RUNNER = r"""
import sys, json
sys.modules["torch"] = None  # the loader must work without torch: make `import torch` fail here
import numpy as np
import tcexport.loader as L
from tcexport.loader.dtypes import numpy_dtype
pkg, folder, device = sys.argv[1], sys.argv[2], sys.argv[3]
plan = json.load(open(f"{folder}/plan.json"))
model = L.load(pkg, device=device)

def retag(a, dtype):  # .npy drops the bfloat16 tag of the uint16 bits; the manifest says which inputs have it
    return a.view(numpy_dtype(dtype)) if dtype == "bfloat16" and a.dtype == np.uint16 else a

def untag(a):
    return a if a.dtype.metadata is None else a.view(np.uint16)

for c, (method, dtypes) in enumerate(plan["cases"]):
    inputs = [retag(np.load(f"{folder}/case{c}_in{k}.npy"), d) for k, d in enumerate(dtypes)]
    out = model.methods[method](*inputs)
    for k, o in enumerate(out if isinstance(out, tuple) else (out,)):
        np.save(f"{folder}/case{c}_out{k}.npy", untag(o))
state = model.state() if hasattr(model, "state") else {}
for k, name in enumerate(state):
    np.save(f"{folder}/state{k}.npy", untag(state[name]))
print(json.dumps({"state": list(state), "torch_loaded": "torch" in sys.modules and sys.modules["torch"] is not None}))
"""


def method_cases(spec: ModelSpec, manifest) -> list[tuple[str, str, list[np.ndarray]]]:
    """(method, label, input arrays): every method at its example inputs in declared order, then, for a package
    without state, each method at its range ends."""
    each = {m.name: make_cases(spec.for_method(m), manifest.method(m.name)) for m in spec.methods}
    cases = [(name, "example", made[0][1]) for name, made in each.items()]
    if not any(manifest.method(name).state for name in each):
        cases += [(name, label, arrays) for name, made in each.items() for label, arrays in made[1:]]
    return cases


def _run_eager(module: torch.nn.Module, spec: ModelSpec, cases,
               double: bool = False) -> tuple[list, torch.nn.Module]:
    """Each case's outputs (loader arrays; float64 arrays where ``double``) from one copy of ``module``, in order;
    then the copy, whose buffers hold the state the sequence left."""
    functions = {m.name: m.function for m in spec.methods}
    module = copy.deepcopy(module)
    if double:
        module = module.double()
    outs = []
    with torch.no_grad():
        for method, _, arrays in cases:
            inputs = [to_torch(a.copy()) for a in arrays]
            out = getattr(module, functions[method])(*[_double(t) for t in inputs] if double else inputs)
            out = out if isinstance(out, (tuple, list)) else (out,)
            outs.append([o.detach().double().numpy() if double else to_numpy(o.detach(), f"output{k}").copy()
                         for k, o in enumerate(out)])
    return outs, module


def verify_methods(spec: ModelSpec, package: Path, quiet: bool = False) -> dict:
    """The report verify.verify makes, for a package with methods: one entry per (case, output), labelled
    ``method:case``, and one per state array, labelled ``state:<name>``."""
    manifest = open_archive(package).manifest
    where = where_to_run(manifest)
    report = {"ok": True, "cases": [], "ran_on": where}
    if where == "triton-interpreter":
        report.update(ok=False, error="a package with methods and no CPU kernels is verified on a GPU, and this "
                      "machine has none; add the cpu target (--target cpu,cuda:...) to verify here")
        if not quiet:
            print(f"verify: {report['error']}", file=sys.stderr)
        return report
    cases = method_cases(spec, manifest)
    expected, module = _run_eager(spec.module, spec, cases)
    reference = _SequenceReference(spec, cases)
    with tempfile.TemporaryDirectory(prefix="tcexport-verify-") as tmp:
        plan = [(method, [s.dtype for s in own_specs(manifest.method(method), "inputs")])
                for method, _, _ in cases]
        Path(tmp, "plan.json").write_text(json.dumps({"cases": plan}))
        for c, (_, _, arrays) in enumerate(cases):
            for k, a in enumerate(arrays):
                np.save(f"{tmp}/case{c}_in{k}.npy", _untag(a))
        proc = subprocess.run([sys.executable, "-c", RUNNER, str(package), tmp, where], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            report.update(ok=False, error=proc.stderr.strip()[-4000:])
            if not quiet:
                print(f"verify: the torch-free run failed:\n{report['error']}", file=sys.stderr)
            return report
        done = json.loads(proc.stdout.strip().splitlines()[-1])
        report["torch_loaded_in_runner"] = done["torch_loaded"]
        for c, (method, label, arrays) in enumerate(cases):
            outputs = own_specs(manifest.method(method), "outputs")
            for k, want in enumerate(expected[c]):
                got = _retag(np.load(f"{tmp}/case{c}_out{k}.npy"), outputs[k].dtype)
                report["cases"].append(_compare(f"{method}:{label}", k, arrays, got, want,
                                                lambda c=c: reference.outputs(c)))
        buffers = dict(module.named_buffers())
        dtypes = {s.name: manifest.inputs[s.input].dtype for s in manifest.state}
        for k, name in enumerate(done["state"]):
            got = _retag(np.load(f"{tmp}/state{k}.npy"), dtypes.get(name, ""))
            want = to_numpy(buffers[name].detach(), name).copy() if name in buffers else np.zeros(0)
            report["cases"].append(_compare(f"state:{name}", 0, [], got, want, lambda n=name: [reference.state(n)]))
    report["ok"] = all(c["ok"] for c in report["cases"])
    if not quiet:
        _print(report, cases, tmp_outputs=None)
    return report


class _SequenceReference:
    """The whole sequence run once in float64 (for a 16-bit float output that misses eager's tolerance); None
    where the model cannot run in float64."""

    def __init__(self, spec: ModelSpec, cases):
        self.spec, self.cases, self.result, self.failed = spec, cases, None, False

    def _run(self):
        if self.result is None and not self.failed:
            try:
                self.result = _run_eager(self.spec.module, self.spec, self.cases, double=True)
            except Exception:  # noqa: BLE001 - a model that cannot run in float64 is judged by the tolerance alone
                self.failed = True
        return self.result

    def outputs(self, c: int):
        r = self._run()
        return None if r is None else r[0][c]

    def state(self, name: str):
        r = self._run()
        buffers = {} if r is None else dict(r[1].named_buffers())
        return buffers[name].detach().double().numpy() if name in buffers else None
