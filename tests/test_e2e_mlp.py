"""examples/mlp.py end to end: export, verified load, guarded calls, threads, tampering, determinism."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import zipfile

import numpy as np
import pytest
import torch

import tcexport.loader as L
from tcexport.formats import errors as E
from packages import EXAMPLES, WORK, load_module, mlp_package

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def eager():
    return load_module(EXAMPLES / "mlp.py").model().eval()


@pytest.fixture(scope="module")
def model():
    return L.load(mlp_package())


def _eager(module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("batch", [1, 7, 64, 1024])
def test_matches_eager(model, eager, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 64), dtype=np.float32)
    got = model(x)
    assert got.shape == (batch, 32) and got.dtype == np.float32
    np.testing.assert_allclose(got, _eager(eager, x), atol=1e-5, rtol=1e-4)


def test_signature_metadata(model):
    (x,), (out,) = model.inputs, model.outputs
    assert (x.name, x.dtype, list(x.shape)) == ("x", "float32", ["batch", 64])
    assert (out.name, out.dtype, list(out.shape)) == ("output", "float32", ["batch", 32])
    assert [(s.name, s.min, s.max) for s in model.manifest.symbols] == [("batch", 1, 1024)]


def test_torch_tensors_in_and_out(model, eager):
    x = torch.randn(5, 64)
    got = model(x)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, eager(x).detach(), atol=1e-5, rtol=1e-4)


def test_fusion_is_real(model):
    """GEMM+bias, LayerNorm+GELU, GEMM+bias, softmax: four kernels, each op group fused as the IR allows."""
    kernels = model.manifest.plan["kernels"]
    assert len(kernels) == 4, kernels
    assert kernels[0].endswith("gemm_epilogue") and kernels[2].endswith("gemm_epilogue")
    assert "reduce" in kernels[1] and "reduce_max_sum" in kernels[3]
    with zipfile.ZipFile(mlp_package()) as z:
        cpp = z.read("src/cpu/model.cpp").decode()
    # both linears read their weights as packed panels (front/weights_panels.py)
    assert cpp.count("tc_gemm_panels(f.nt") == 2 and "std::erf" in cpp and "tc_parallel_range(" in cpp


@pytest.mark.parametrize("bad, error, attrs", [
    (np.zeros((0, 64), np.float32), E.SymbolRangeError, {"input": "x", "dim": 0, "symbol": "batch", "got": 0}),
    (np.zeros((1025, 64), np.float32), E.SymbolRangeError, {"symbol": "batch", "got": 1025}),
    (np.zeros((4, 63), np.float32), E.StaticDimError, {"input": "x", "dim": 1, "expected": 64, "got": 63}),
    (np.zeros((4, 64), np.float64), E.DtypeError, {"input": "x", "expected": "float32", "got": "float64"}),
    (np.zeros((4, 64, 1), np.float32), E.RankError, {"input": "x", "expected": 2, "got": 3}),
])
def test_guard_failures(model, bad, error, attrs):
    with pytest.raises(error) as info:
        model(bad)
    for k, v in attrs.items():
        assert getattr(info.value, k) == v, (k, getattr(info.value, k))
    assert "x" in str(info.value)


def test_range_error_message_names_everything(model):
    with pytest.raises(E.SymbolRangeError) as info:
        model(np.zeros((2000, 64), np.float32))
    msg = str(info.value)
    for part in ("x", "dim 0", "batch", "1", "1024", "2000"):
        assert part in msg, (part, msg)


def test_wrong_number_of_inputs(model):
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(E.ArityError):
        model(x, x)
    with pytest.raises(E.ArityError):
        model()


def test_concurrent_calls_match_serial(model):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((b, 64), dtype=np.float32) for b in (1, 3, 17, 64, 200, 5, 33, 128)]
    serial = [model(x) for x in xs]
    results: dict = {}
    errors: list = []

    def work(t):
        try:
            for rep in range(20):
                k = (t + rep) % len(xs)
                results[(t, rep)] = (k, model(xs[k]))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, out in results.values():
        np.testing.assert_array_equal(out, serial[k])


def test_rebuild_is_byte_identical(tmp_path):
    """Two exports with separate build caches (so the compiler really runs twice) give identical archives."""
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export

    paths = []
    for k in range(2):
        spec = load_model_file(EXAMPLES / "mlp.py")
        pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, name="mlp",
                     cache_dir=tmp_path / f"cache{k}")
        paths.append(pkg.save(tmp_path / f"mlp{k}.tcpkg"))
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_tampered_library_is_rejected_before_loading(tmp_path):
    """Flip one byte of the CPU library inside the archive: load fails, and nothing was extracted or dlopened."""
    src = mlp_package()
    bad = tmp_path / "bad.tcpkg"
    shutil.copy(src, bad)
    from tcexport.loader.archive import open_archive

    offset, size = open_archive(src).file_span("kernels/cpu-x86-64-v3.so")
    data = bytearray(bad.read_bytes())
    data[offset + size // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    code = (f"import tcexport.loader as L, sys\nfrom tcexport.formats import IntegrityError\n"
            f"try:\n    L.load({str(bad)!r}, cache_dir={str(cache)!r})\n"
            f"except IntegrityError as e:\n    print('REJECTED', e)\n"
            f"maps = open('/proc/self/maps').read()\n"
            f"print('LOADED' if 'cpu-x86-64' in maps or {str(cache)!r} in maps else 'CLEAN')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "REJECTED" in out and "kernels/cpu-x86-64-v3.so" in out and "CLEAN" in out, out
    assert not cache.exists() or not any(cache.rglob("*.so"))


def test_loads_and_runs_without_torch():
    code = ("import sys\nsys.modules['torch'] = None\n"
            "import numpy as np, tcexport.loader as L\n"
            f"m = L.load({str(mlp_package())!r})\n"
            "y = m(np.ones((3, 64), np.float32))\n"
            "assert y.shape == (3, 32) and abs(float(y.sum()) - 3.0) < 1e-4, y.sum()\n"
            "print('OK', sorted(k for k in sys.modules if k.startswith(('torch', 'triton', 'sympy')) and sys.modules[k]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK []", out.stdout
