"""A GEMM's epilogue (bias, activation, residual) runs on each block of C as the CPU's GEMM finishes it
(``tc_epi``, cpu/codegen.py and runtime/prelude.h) instead of in a pass of its own: unbatched and batched products,
through the AVX-512 kernel and through the BLAS of an older ISA, all match eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tcexport.exporter import export
from tcexport.loader import load

pytestmark = pytest.mark.slow


class _Epilogues(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(48, 200)     # bias + GELU: 200 columns cross a 32-wide tile's edge
        self.down = nn.Linear(200, 48)   # bias + the residual
        self.scale = nn.Parameter(torch.randn(48))

    def forward(self, x, y):
        h = x + self.down(nn.functional.gelu(self.up(x)))
        scores = torch.relu(h @ y.transpose(1, 2)) * 0.5 + 1.0   # batched: (batch, rows, cols)
        return h * self.scale, scores


def _inputs(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 37, 48, generator=g), torch.randn(batch, 21, 48, generator=g)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("epilogue")
    path = tmp / "epilogue.tcpkg"
    batch = {0: ("batch", 1, 300)}
    export(_Epilogues().eval(), _inputs(2), dynamic_shapes={"x": batch, "y": batch}, cache_dir=tmp / "cache",
           dump=tmp / "dump").save(path)
    return path, (tmp / "dump" / "model.cpp").read_text()


def test_each_gemm_with_an_epilogue_runs_it_on_its_blocks(package):
    _, cpp = package
    gemms = cpp.count("tc_gemm<float>(")
    assert gemms >= 3 and cpp.count(", tc_epi);") == gemms, (gemms, cpp.count(", tc_epi);"))


@pytest.mark.parametrize("isa", [None, "x86-64-v3"])
@pytest.mark.parametrize("batch", [1, 3, 300])  # 300 x 37 rows: more than one 256-row block of A
def test_matches_eager(package, batch, isa):
    path, _ = package
    model = load(path, isa=isa)
    xs = _inputs(batch, seed=batch)
    with torch.no_grad():
        want = _Epilogues().eval()(*xs)
    got = model(*[x.numpy() for x in xs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-4)
