"""A convolution's GEMM on the CPU reads its taps from a zero-padded, phase-split copy of its input instead of
im2col's columns (exporter/schedule/window_gemm.py): strides, dilations, uneven padding and 1-D windows all match
eager at every batch, through the AVX-512 kernel (rows gathered as it packs) and the BLAS of an older ISA (rows copied);
windows where a copy does not pay (1x1, a patchify, many dropped columns per output) keep im2col."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tcexport.exporter import export
from tcexport.loader import load

pytestmark = pytest.mark.slow


class _Convs(nn.Module):
    """Windows of every geometry the rewrite takes, and three it leaves to im2col."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.same = nn.Conv2d(8, 8, 3, padding=1)                                        # taken; + residual
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)                 # taken: 2 phases a dim
        self.odd = nn.Conv2d(16, 8, (5, 3), stride=(2, 1), padding=(2, 0), dilation=(1, 2))  # taken
        self.stem = nn.Conv2d(3, 8, 7, stride=2, padding=3)                              # taken
        self.point = nn.Conv2d(8, 8, 1, stride=2)                                        # 1x1: kept
        self.patch = nn.Conv2d(3, 8, 4, stride=4)                                        # patchify: kept
        self.narrow = nn.Conv2d(8, 256, 3, padding=1)                                    # at 7 wide: kept

    def forward(self, x, img, small):
        y = torch.relu(self.same(x)) + x
        y = self.odd(self.down(y))
        return y, self.stem(img), self.point(x), self.patch(img), self.narrow(small)


class _Conv1d(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.a = nn.Conv1d(6, 12, 3, padding=1)
        self.b = nn.Conv1d(12, 12, 3, stride=2, padding=1)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))


def _inputs(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 8, 19, 21, generator=g), torch.randn(batch, 3, 32, 28, generator=g),
            torch.randn(batch, 8, 7, 7, generator=g))


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("window_gemm")
    batch = {0: ("batch", 1, 8)}
    export(_Convs().eval(), _inputs(2), dynamic_shapes={"x": batch, "img": batch, "small": batch},
           cache_dir=tmp / "cache", dump=tmp / "dump").save(tmp / "convs.tcpkg")
    export(_Conv1d().eval(), (torch.randn(2, 6, 40),), dynamic_shapes={"x": batch},
           cache_dir=tmp / "cache", dump=tmp / "dump1d").save(tmp / "conv1d.tcpkg")
    return tmp


def test_taken_where_it_pays(packages):
    cpp = (packages / "dump" / "model.cpp").read_text()
    gemms = cpp.count("tc_gemm<float>(")
    in_place = cpp.count("tc_brows.data());")
    assert gemms == 6 and in_place == 4, (gemms, in_place)  # same, down, odd, stem; not point, patch, narrow
    # narrow's 256 channels over 49 positions run transposed on its packed weight (front/weights_panels.py)
    assert cpp.count("tc_gemm_panels_t(f.nt") == 1
    assert cpp.count("_phases(const Frame& f)") == 4
    assert (packages / "dump1d" / "model.cpp").read_text().count("tc_brows.data());") == 2


@pytest.mark.parametrize("isa", [None, "x86-64-v3"])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_matches_eager(packages, batch, isa):
    model = load(packages / "convs.tcpkg", isa=isa)
    xs = _inputs(batch, seed=batch)
    with torch.no_grad():
        want = _Convs().eval()(*xs)
    got = model(*[x.numpy() for x in xs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_1d_matches_eager(packages, batch):
    x = torch.randn(batch, 6, 40, generator=torch.Generator().manual_seed(batch))
    with torch.no_grad():
        want = _Conv1d().eval()(x)
    got = load(packages / "conv1d.tcpkg")(x.numpy())
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)
