"""examples/mlp.py converted to bfloat16 and to float16, end to end: exported with a dynamic batch, run torch-free
(numpy in and out, in a process where ``import torch`` fails) and in-process with torch 16-bit tensors in and
out, at every ISA level this CPU runs; compared with eager in the same dtype and with a float64 reference."""

from __future__ import annotations

import copy
import functools
import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

import tcexport.loader as L
from tcexport.formats import errors as E
from tcexport.loader.dtypes import BFLOAT16, dtype_name
from packages import EXAMPLES, WORK, load_module

pytestmark = pytest.mark.slow

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
BATCHES = (1, 7, 1024)  # 1024 is the end of the example's batch range
# against the float64 reference: torch.testing's own tolerance for the dtype (rtol), float16 at twice it
# (eager itself reaches 1e-3 on these softmax outputs); atol for the smallest probabilities
TOLERANCE = {"bfloat16": (1.6e-2, 1e-5), "float16": (2e-3, 1e-5)}

RUNNER = r"""
import sys, json
sys.modules["torch"] = None  # the loader must work without torch: make `import torch` fail here
import numpy as np
import tcexport.loader as L
from tcexport.loader.dtypes import BFLOAT16, dtype_name
pkg, folder, isas, batches = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(",")
report = {"torch": sys.modules["torch"] is not None, "dtypes": []}
for isa in isas:
    model = L.load(pkg, isa=isa)
    for b in batches:
        x = np.load(f"{folder}/x{b}.npy")
        y = model(x.view(BFLOAT16) if model.inputs[0].dtype == "bfloat16" else x)
        report["dtypes"].append(dtype_name(y.dtype))
        np.save(f"{folder}/y{b}_{isa}.npy", y.view(np.uint16))
print(json.dumps(report))
"""


@functools.lru_cache(maxsize=None)
def _modules(kind: str):
    """The example MLP in ``kind`` (eager) and the same weights in float64 (the reference)."""
    mod = load_module(EXAMPLES / "mlp.py")
    half = mod.model().eval().to(DTYPES[kind])
    return mod, half, copy.deepcopy(half).double()


@functools.lru_cache(maxsize=None)
def _package(kind: str):
    from tcexport.exporter.pipeline import export

    mod, half, _ = _modules(kind)
    x = mod.example_inputs()[0].to(DTYPES[kind])
    path = WORK / f"mlp-{kind}.tcpkg"
    export(half, (x,), mod.dynamic_shapes, name=f"mlp_{kind}").save(path)
    return path


@pytest.fixture(params=list(DTYPES))
def kind(request):
    return request.param


def _input(kind: str, batch: int) -> torch.Tensor:
    return torch.randn(batch, 64, generator=torch.Generator().manual_seed(batch)).to(DTYPES[kind])


def _isas(path) -> list[str]:
    from tcexport.loader.native_cpu import cpu_flags

    flags = cpu_flags() or set()
    return [k.isa for k in L.load(path).manifest.kernels if k.target == "cpu" and set(k.requires) <= flags]


def _check(got: torch.Tensor, x: torch.Tensor, kind: str, where: str) -> None:
    """``got`` is at most one rounding from eager everywhere (softmax outputs are positive, so neighbouring
    16-bit values differ by one in their bit patterns), and close to the float64 reference."""
    _, half, ref_module = _modules(kind)
    with torch.no_grad():
        eager, ref = half(x), ref_module(x.double())
    assert got.dtype == eager.dtype and got.shape == eager.shape, where
    steps = (got.view(torch.int16).int() - eager.view(torch.int16).int()).abs()
    assert steps.max() <= 1, f"{where}: {int((steps > 1).sum())} elements more than one rounding from eager"
    rtol, atol = TOLERANCE[kind]
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=atol, msg=lambda m: f"{where}: {m}")


def test_torch_free_with_numpy_arrays(kind, tmp_path):
    path = _package(kind)
    isas = _isas(path)
    assert "x86-64" in isas, isas
    for b in BATCHES:
        np.save(tmp_path / f"x{b}.npy", _input(kind, b).view(torch.int16).numpy().view(np.uint16)
                if kind == "bfloat16" else _input(kind, b).numpy())
    out = subprocess.run([sys.executable, "-c", RUNNER, str(path), str(tmp_path), ",".join(isas),
                          ",".join(map(str, BATCHES))], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["torch"] is False and set(report["dtypes"]) == {kind}
    for isa in isas:
        for b in BATCHES:
            bits = torch.from_numpy(np.load(tmp_path / f"y{b}_{isa}.npy").view(np.int16))
            _check(bits.view(DTYPES[kind]), _input(kind, b), kind, f"{kind} batch {b} on {isa}")


def test_torch_tensors_in_and_out(kind):
    model = L.load(_package(kind))
    for b in BATCHES:
        x = _input(kind, b)
        got = model(x)
        assert isinstance(got, torch.Tensor) and got.dtype == DTYPES[kind]
        _check(got, x, kind, f"{kind} batch {b}")
        arr = x.view(torch.int16).numpy().view(BFLOAT16) if kind == "bfloat16" else x.numpy()
        same = model(arr)
        assert isinstance(same, np.ndarray) and dtype_name(same.dtype) == kind
        assert np.array_equal(same.view(np.uint16), got.view(torch.int16).numpy().view(np.uint16))


def test_package_keeps_16_bit_storage(kind):
    """Inputs, outputs and weights stay 16-bit in the package (half the float32 bytes); GEMMs run in float32
    through sgemm on widened operands, and every other kernel converts at its loads and stores."""
    path = _package(kind)
    model = L.load(path)
    assert [s.dtype for s in model.inputs] == [kind] and [s.dtype for s in model.outputs] == [kind]
    assert {w.dtype for w in model.manifest.weights} == {kind}
    assert [(s.name, s.min, s.max) for s in model.manifest.symbols] == [("batch", 1, 1024)]
    with zipfile.ZipFile(path) as z:
        cpp = z.read("src/cpu/model.cpp").decode()
    short = "f16" if kind == "float16" else "bf16"
    assert cpp.count("tc_gemm<float>(f.sgemm") == 2 and "tc_gemm<double>" not in cpp
    assert f"tc_{short}_to_float(in_x[" in cpp and f"out_output[" in cpp and f"tc_float_to_{short}(" in cpp


def test_a_float32_array_is_refused(kind):
    model = L.load(_package(kind))
    with pytest.raises(E.DtypeError) as info:
        model(np.zeros((2, 64), np.float32))
    assert (info.value.input, info.value.expected, info.value.got) == ("x", kind, "float32")
