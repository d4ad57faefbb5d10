"""Small models that exercise views, tuples, shared symbols, several symbols and batched matmuls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tcexport.loader as L
from tcexport.exporter.errors import UnsupportedOpError
from tcexport.formats import errors as E
from packages import MODELS, built, load_module

pytestmark = pytest.mark.slow

CASES = {
    "block3d": [[(1, 1, 32)], [(3, 7, 32)], [(64, 128, 32)], [(2, 1, 32)]],
    "two_inputs": [[(1, 16), (1, 16)], [(9, 16), (9, 16)]],
    "attention": [[(1, 1, 16)], [(3, 5, 16)], [(16, 64, 16)]],
}


def _run_both(name, shapes):
    pkg = L.load(built(str(MODELS / f"{name}.py")))
    module = load_module(MODELS / f"{name}.py").model().eval()
    rng = np.random.default_rng(len(shapes[0]))
    xs = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    got = pkg(*xs)
    with torch.no_grad():
        want = module(*[torch.from_numpy(x) for x in xs])
    return pkg, got, want


@pytest.mark.parametrize("name, shapes", [(n, s) for n, cases in CASES.items() for s in cases])
def test_matches_eager(name, shapes):
    pkg, got, want = _run_both(name, shapes)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), atol=2e-5, rtol=1e-4)


def test_tuple_output_structure():
    pkg, got, _ = _run_both("block3d", [(2, 3, 32)])
    assert isinstance(got, tuple) and [o.name for o in pkg.outputs] == ["output0", "output1"]
    assert [list(o.shape) for o in pkg.outputs] == [["batch", "seq", 32], ["batch", 32]]


def test_shared_symbol_conflict_is_a_guard_error():
    pkg = L.load(built(str(MODELS / "two_inputs.py")))
    with pytest.raises(E.SymbolConflictError) as info:
        pkg(np.zeros((3, 16), np.float32), np.zeros((4, 16), np.float32))
    err = info.value
    assert err.symbol == "batch" and err.input == "b" and err.got == 4 and err.expected == 3
    assert "a" in str(err) and "b" in str(err)


def test_two_symbols_bind_independently():
    pkg = L.load(built(str(MODELS / "attention.py")))
    assert [s.name for s in pkg.manifest.symbols] == ["batch", "seq"]
    with pytest.raises(E.SymbolRangeError) as info:
        pkg(np.zeros((2, 65, 16), np.float32))
    assert info.value.symbol == "seq" and info.value.dim == 1


def test_unsupported_op_names_op_and_source_line():
    with pytest.raises(UnsupportedOpError) as info:
        built(str(MODELS / "unsupported.py"))
    msg = str(info.value)
    line = next(k for k, text in enumerate((MODELS / "unsupported.py").read_text().splitlines(), 1) if "sort(y" in text)
    assert "sort" in msg and f"unsupported.py:{line}" in msg and "torch.sort(y, dim=-1)" in msg
    assert info.value.op.startswith("aten.sort")
