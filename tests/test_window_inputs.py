"""What a window (a depthwise convolution's or a pooling's taps) reads: a cheap producer is inlined into its taps
only while that reads less than keeping it (schedule/fuse._taps_reread). ConvNeXt's residual add, read through a
transpose by the next block's 7x7 depthwise convolution, is a kernel of its own, so the window reads a buffer of
its own layout (and a zero-padded copy of it); a ReLU before a 3x3 pooling stays inlined."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from packages import exported_with_source

pytestmark = pytest.mark.slow


class _Block(nn.Module):
    """A ConvNeXt block's tail (the MLP's output, channels last, added to the block's input) into the next block's
    depthwise convolution; and a ReLU into a max pooling."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 8)
        self.dw = nn.Conv2d(8, 8, 7, padding=3, groups=8)
        self.pool = nn.MaxPool2d(3, stride=1, padding=1)

    def forward(self, x):
        residual = x + self.fc(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.dw(residual), self.pool(torch.relu(x))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    x = torch.randn(2, 8, 12, 12)
    return exported_with_source(_Block().eval(), (x,), {"x": {0: ("batch", 1, 4)}},
                                tmp_path_factory.mktemp("window-inputs"))


def _kernels(cpp: str) -> dict:
    """Kernel name -> its IR comment lines (the generated C++ starts each kernel with them)."""
    out, name = {}, None
    for line in cpp.splitlines():
        m = re.match(r"// (k\d+_\w+) \[", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name and line.startswith("//     "):
            out[name].append(line)
    return out


def test_the_residual_add_is_its_own_kernel_and_the_window_reads_a_padded_copy(package):
    _, cpp = package
    kernels = _kernels(cpp)
    adds = [k for k, lines in kernels.items()
            if len(lines) == 1 and re.search(r"= add\(in_x\[i0, i1, i2, i3\], buf\d+\[i0, i2, i3, i1\]\)$", lines[0])]
    assert len(adds) == 1, kernels
    pads = [k for k in kernels if k.endswith("_pad")]
    assert len(pads) == 1, kernels
    (pad,) = kernels[pads[0]]
    assert re.search(r"buf\d+\[i0, i1, Min\(11, Max\(0, i2 - 3\)\), Min\(11, Max\(0, i3 - 3\)\)\]", pad), pad


def test_a_relu_stays_inlined_into_the_pooling(package):
    _, cpp = package
    lines = [ln for lines in _kernels(cpp).values() for ln in lines]
    assert not any(re.search(r"= relu\(in_x\[i0, i1, i2, i3\]\)$", ln) for ln in lines), lines
    (pooling,) = [ln for ln in lines if ln.count("maximum(") >= 8]
    assert pooling.count("relu(in_x[") == 9, pooling


@pytest.mark.parametrize("batch", [1, 3])
def test_matches_eager(package, batch):
    model, _ = package
    x = torch.randn(batch, 8, 12, 12, generator=torch.Generator().manual_seed(batch))
    with torch.no_grad():
        want = _Block().eval()(x)
    for got, w in zip(model(x.numpy()), want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-5)
