"""The Python API, dynamic-shape specs, model-file errors, and the IR's own checks."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tcexport.loader as L
from tcexport.exporter import export
from tcexport.exporter.front import dynamic
from tcexport.exporter.errors import DynamicSpecError, ModelFileError
from tcexport.exporter.front.model_file import load_model_file


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.sigmoid(self.lin(x)) * 2 - 1


@pytest.mark.slow
def test_python_api_round_trip(tmp_path):
    torch.manual_seed(0)
    m = Tiny()
    pkg = export(m, (torch.randn(3, 8),), dynamic_shapes={"x": {0: ("n", 1, 100)}})
    path = pkg.save(tmp_path / "tiny.tcpkg")
    loaded = L.load(path)
    assert [(s.name, list(s.shape)) for s in loaded.inputs] == [("x", ["n", 8])]
    x = np.random.default_rng(0).standard_normal((100, 8), dtype=np.float32)
    np.testing.assert_allclose(loaded(x), m(torch.from_numpy(x)).detach().numpy(), atol=1e-6, rtol=1e-5)
    assert loaded(x=x).shape == (100, 4)


@pytest.mark.slow
@pytest.mark.parametrize("view", ["rows", "columns", "transposed"])
def test_an_example_input_may_be_a_view(tmp_path, view):
    """A slice or transpose of a bigger tensor as the example (torch.export would add symbols for its storage)."""
    torch.manual_seed(0)
    m = Tiny()
    base = torch.randn(16, 16)
    example = {"rows": base[:3, :8], "columns": base[:, 8:], "transposed": base[:8, :5].t()}[view]
    pkg = export(m, (example,), dynamic_shapes={"x": {0: ("n", 1, 100)}})
    loaded = L.load(pkg.save(tmp_path / "view.tcpkg"))
    x = np.random.default_rng(0).standard_normal((7, 8), dtype=np.float32)
    np.testing.assert_allclose(loaded(x), m(torch.from_numpy(x)).detach().numpy(), atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_static_export_has_no_symbols(tmp_path):
    pkg = export(Tiny(), (torch.randn(3, 8),))
    loaded = L.load(pkg.save(tmp_path / "static.tcpkg"))
    assert loaded.manifest.symbols == () and list(loaded.inputs[0].shape) == [3, 8]


@pytest.mark.parametrize("text, expect", [
    ("batch", ({"x": {0: "batch"}, "m": {0: "batch"}}, (1, None))),
    ("batch=1:512", ({"x": {0: "batch"}, "m": {0: "batch"}}, (1, 512))),
    ("seq@x.1,m.1", ({"x": {1: "seq"}, "m": {1: "seq"}}, (1, None))),
    ("seq=2:2048@x.1", ({"x": {1: "seq"}}, (2, 2048))),
    ("batch=:64", ({"x": {0: "batch"}, "m": {0: "batch"}}, (1, 64))),
])
def test_cli_dynamic_specs(text, expect):
    sym, places = dynamic.parse_cli_spec(text, ["x", "m"], [2, 2])
    assert places == expect[0] and (sym.min, sym.max) == expect[1]


@pytest.mark.parametrize("text", ["", "1batch", "batch=5:2", "batch@x", "batch=a:b", "seq@x.one"])
def test_bad_cli_dynamic_specs(text):
    with pytest.raises(DynamicSpecError):
        dynamic.parse_cli_spec(text, ["x"], [2])


def test_dynamic_spec_checks_inputs_and_ranges():
    ex = (torch.zeros(4, 3),)
    with pytest.raises(DynamicSpecError, match="forward\\(\\) takes"):
        dynamic.resolve(["x"], ex, None, ["n@y.0"])
    with pytest.raises(DynamicSpecError, match="rank 2"):
        dynamic.resolve(["x"], ex, None, ["n@x.2"])
    with pytest.raises(DynamicSpecError, match="outside the range"):
        dynamic.resolve(["x"], ex, None, ["n=8:16"])
    with pytest.raises(DynamicSpecError):
        dynamic.resolve(["x"], ex, {"x": {0: ("n", 1)}}, [])


@pytest.mark.parametrize("source, fragment", [
    ("x = 1\n", "defines no `model`"),
    ("model = 3\nexample_inputs = ()\n", "should be an nn.Module"),
    ("import torch\nmodel = torch.nn.ReLU()\n", "defines no `example_inputs`"),
    ("import torch\nmodel = torch.nn.ReLU()\ndef example_inputs():\n    return [1]\n", "should be a torch.Tensor"),
    ("import torch\ndef model():\n    return 5\nexample_inputs = ()\n", "should return a torch.nn.Module"),
    ("raise RuntimeError('boom in user code')\n", "boom in user code"),
    ("import torch\nmodel = torch.nn.ReLU()\nexample_inputs = lambda: (torch.zeros(2),)\ndynamic_shapes = [1]\n",
     "dynamic_shapes should be a dict"),
])
def test_model_file_errors(tmp_path, source, fragment):
    path = tmp_path / "m.py"
    path.write_text(source)
    with pytest.raises(ModelFileError, match=None) as info:
        load_model_file(path)
    assert fragment in str(info.value) and str(path) in str(info.value)


def test_missing_model_file(tmp_path):
    with pytest.raises(ModelFileError, match="no such file"):
        load_model_file(tmp_path / "nope.py")


def test_ir_prints_and_verifies():
    from tcexport.exporter.front import capture
    from tcexport.exporter.schedule import fuse
    from tcexport.exporter.lower import core as lower

    spec = load_model_file(__import__("packages").EXAMPLES / "mlp.py")
    prog, _ = lower.lower_inference(capture.capture(spec, []))
    prog.verify()
    text = str(prog)
    assert "gemm(" in text and "erf(" in text and "batch in [1, 1024]" in text
    kernels = fuse.fuse(prog)
    prog.verify()
    assert "registers=" in str(kernels[1])
    # a broken program is caught
    prog.nodes.reverse()
    with pytest.raises(AssertionError):
        prog.verify()


class Positions(torch.nn.Module):
    """Weights from positions alone (arange, scaled and shifted), read once per (row, column) pair."""

    def forward(self, x):
        pos = torch.arange(x.shape[1]) * 3 + 1
        return (x[:, :, None] * pos[None, None, :]).sum(-1)


def test_a_function_of_the_indices_alone_is_recomputed_where_it_is_read(tmp_path):
    """Keeping ``pos`` in memory would cost a kernel of its own; a few integer operations per element of the
    reduction cost less, so fusion inlines it there (fuse._index_only) and the model is one kernel."""
    x = torch.randn(2, 5)
    pkg = export(Positions(), (x,), {"x": {1: ("seq", 1, 64)}}, dump=tmp_path / "dump")
    text = (tmp_path / "dump" / "kernels.txt").read_text()
    kernels = [line for line in text.splitlines() if re.match(r"k\d+_", line)]
    assert len(kernels) == 1, text
    path = pkg.save(tmp_path / "positions.tcpkg")
    for n in (1, 7):
        xn = torch.randn(2, n)
        np.testing.assert_allclose(L.load(path)(xn.numpy()), Positions()(xn).numpy(), rtol=1e-5, atol=1e-5)
