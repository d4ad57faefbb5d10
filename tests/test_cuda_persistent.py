"""Persistent GEMMs (exporter/cuda/gemm.py persistent_head): a vocabulary-sized 16-bit GEMM over many rows
runs min(SM count, tiles) programs, each walking its tiles, with TMA descriptor loads. Checked without a GPU:
the grids name the loader's SM count, the kernels run in Triton's interpreter (where the SM count is 3, so each
program walks many tiles) against eager, and the sm_90 cubins declare the global scratch their descriptors need."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from tcexport.exporter.front.model_file import load_model_file  # noqa: E402
from tcexport.exporter.pipeline import export  # noqa: E402
from tcexport.exporter.check.interpret import run_interpreted  # noqa: E402
from tcexport.formats import expr as ex  # noqa: E402
from tcexport.formats.errors import FormatError  # noqa: E402
from tcexport.formats.manifest import GRAPHS_VERSION, SM_COUNT, parse_manifest  # noqa: E402
from tcexport.formats.records import parse_cubin as _parse_cubin  # noqa: E402
from tcexport.loader.archive import open_archive  # noqa: E402
from packages import MODELS, WORK  # noqa: E402

pytestmark = pytest.mark.slow

HEADS = MODELS / "lm_head.py"


def _bf16(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a).view(np.uint16).astype(np.int32)).to(torch.int16).view(torch.bfloat16)


@pytest.fixture(scope="module")
def heads():
    spec = load_model_file(str(HEADS))
    path = WORK / "persistent-heads.tcpkg"
    export(spec.module, spec.example_inputs, spec.dynamic_shapes, "cuda:sm_90", name="heads",
           build_cubins=False).save(path)
    return spec, path


def test_vocabulary_sized_gemms_over_many_rows_are_persistent(heads):
    _, path = heads
    launches = open_archive(path).manifest.cuda.launches
    persistent = [l for l in launches if SM_COUNT in ex.free_symbols(l.grid[0])]
    # both heads' large-M variants (the [N, K] weight and the [K, N] parameter), not their small-M ones
    assert [l.name for l in persistent] == ["k0_gemm_epilogue", "k1_gemm_epilogue"]
    for batch, seq, sms in ((5, 60, 132), (5, 60, 3), (16, 64, 132)):
        tiles = -(-batch * seq // 128) * 65  # 128x256 tiles; both N (16411, 16400) need 65 columns of them
        for launch in persistent:
            grid = [ex.evaluate(g, {"batch": batch, "seq": seq, SM_COUNT: sms}) for g in launch.grid]
            assert grid == [min(sms, tiles), 1, 1]
    source = open_archive(path).read("src/cuda/model_triton.py").decode()
    assert source.count("tl.make_tensor_descriptor(") == 4 and source.count("flatten=True") == 2


def test_persistent_gemms_match_eager_in_the_interpreter(heads):
    """300 rows take the persistent launches (3 programs for 195 tiles each), 40 rows the tile ones."""
    spec, path = heads
    cases = [torch.randn(5, 60, 64).to(torch.bfloat16), torch.randn(2, 20, 64).to(torch.bfloat16)]
    got = run_interpreted(path, [[c.view(torch.uint16).numpy()] for c in cases])
    module = spec.module.double()
    for c, outs in zip(cases, got):
        with torch.no_grad():
            want = module(c.double())
        for g, w in zip(outs, want):
            assert tuple(g.shape) == tuple(w.shape)
            np.testing.assert_allclose(_bf16(g).double().numpy(), w.numpy(), rtol=2e-2, atol=2e-2)


def test_sm_90_cubins_declare_their_descriptors_scratch_and_sm_80_ones_need_none(tmp_path):
    """On sm_90 Triton builds each TMA descriptor in per-program global scratch; the manifest records how much,
    so the loader can reserve it for SM-count programs. sm_80 has no TMA: the same source compiles to plain
    loads."""
    spec = load_model_file(str(HEADS))
    path = export(spec.module, spec.example_inputs, spec.dynamic_shapes, "cuda:sm_80,sm_90", name="heads",
                  cache_dir=WORK / "cache").save(tmp_path / "heads.tcpkg")
    m = open_archive(path).manifest
    persistent = {l.name for l in m.cuda.launches if SM_COUNT in ex.free_symbols(l.grid[0])}
    scratch = {(b.target, c.kernel): c.global_scratch for b in m.kernels for c in m.cubins(b.isa)}
    assert {k: v for (t, k), v in scratch.items() if t == "cuda:sm_90" and v} == {k: 256 for k in persistent}
    assert not any(v for (t, _), v in scratch.items() if t == "cuda:sm_80")


def test_the_sm_count_is_not_a_model_symbol(heads):
    _, path = heads
    doc = json.loads(open_archive(path).manifest.dumps())
    doc["symbols"].append({"name": SM_COUNT, "min": 1, "max": None})
    with pytest.raises(FormatError, match="reserved"):
        parse_manifest(doc)
    assert open_archive(path).manifest.format_version == GRAPHS_VERSION  # no state: still 1.8


class TransposedA(torch.nn.Module):
    """A GEMM whose A operand is read transposed (y^T, y [64, 304]: its row stride is 1, its column stride 304)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 16400) * 0.05)

    def forward(self, y):
        return y.t() @ self.w


def test_a_transposed_operand_is_read_through_a_transposed_descriptor():
    torch.manual_seed(2)
    model = TransposedA().to(torch.bfloat16)
    y = torch.randn(64, 304).to(torch.bfloat16)
    path = WORK / "persistent-transposed.tcpkg"
    export(model, (y,), None, "cuda:sm_90", name="transposed", build_cubins=False).save(path)
    launches = open_archive(path).manifest.cuda.launches
    assert [SM_COUNT in ex.free_symbols(l.grid[0]) for l in launches] == [True]
    source = open_archive(path).read("src/cuda/model_triton.py").decode()
    assert "shape=[K, M], strides=[304, 1], block_shape=[BK, BM])" in source
    (out,), = run_interpreted(path, [[y.view(torch.uint16).numpy()]])
    with torch.no_grad():
        want = model.double()(y.double())
    np.testing.assert_allclose(_bf16(out).double().numpy(), want.numpy(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("value", [-1, True, 1.5, (1 << 20) + 1])
def test_a_cubins_scratch_must_be_a_byte_count(value):
    cubin = {"kernel": "k0", "file": "x", "function": "k0", "shared": 0, "num_warps": 4, "global_scratch": value}
    with pytest.raises(FormatError, match="global_scratch"):
        _parse_cubin(cubin, "kernels[0].cubins[0]")
    assert _parse_cubin({**cubin, "global_scratch": 256}, "c").global_scratch == 256
