"""Max and average pooling over a window known at export are written out tap by tap (lower/conv.py
_window_taps), as a depthwise convolution is: a pointwise node whose output row vectorises, instead of a
reduction over a handful of strided taps per output. Every geometry still matches eager, NaN included (a max
pool propagates it), and the max's -inf padding is a constant select (tc_keep_or) that keeps the row wide."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tcexport.exporter import export
from tcexport.loader import load

pytestmark = pytest.mark.slow


class _Pools(nn.Module):
    def __init__(self):
        super().__init__()
        self.pools = nn.ModuleList([
            nn.MaxPool2d(3, 2, 1),                                   # ResNet's stem
            nn.MaxPool2d(2),
            nn.MaxPool2d(3, 2, 1, ceil_mode=True),
            nn.MaxPool2d(3, 1, 1, dilation=2),
            nn.AvgPool2d(3, 2, 1),
            nn.AvgPool2d(3, 2, 1, count_include_pad=False, ceil_mode=True),
            nn.AvgPool2d(2),
        ])

    def forward(self, x):
        return [p(x) for p in self.pools]


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    path = tmp_path_factory.mktemp("pools") / "pools.tcpkg"
    export(_Pools().eval(), (torch.randn(2, 3, 17, 19),), {"x": {0: "batch"}}).save(path)
    return load(path)


@pytest.mark.parametrize("batch", [1, 3])
def test_pools_match_eager_with_nan(pools, batch):
    x = torch.randn(batch, 3, 17, 19)
    x[0, 1, 4, 5] = float("nan")       # inside a window
    x[-1, 2, 0, 0] = float("nan")      # at a corner the padding shares
    got = pools(x.numpy())
    want = _Pools().eval()(x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-6, atol=1e-6, equal_nan=True)


def test_pools_are_pointwise_with_constant_selects(pools):
    kinds = [n.split("_", 1)[1] for n in pools.manifest.plan["kernels"]]
    assert not [k for k in kinds if k.startswith("reduce")], kinds
    cpp = pools.archive.read("src/cpu/model.cpp").decode()
    assert "tc_keep_or(" in cpp and "-std::numeric_limits<float>::infinity()" in cpp
