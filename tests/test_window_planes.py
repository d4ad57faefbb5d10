"""A window sum over rows shorter than a vector runs along its padded copy's rows laid end to end on the CPU
(exporter/schedule/window_planes.py): one plane kernel per window, its own kernel a copy of each row's first W
positions, and every shape still matches eager; at stride 2 too. A window whose rows fill a vector keeps its
kernel."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from packages import exported_with_source

pytestmark = pytest.mark.slow


class _Windows(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.dw5 = nn.Conv2d(6, 6, 5, padding=2, groups=6)                 # 7 wide: a plane of pitch 11
        self.dw7 = nn.Conv2d(4, 4, 7, padding=3, groups=4)                 # ConvNeXt's 7x7 at 14: pitch 20
        self.dwd = nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=6)     # dilated taps: still y + a, x + b
        self.dws = nn.Conv2d(6, 6, 5, stride=2, padding=2, groups=6)       # 14 -> 7, stride 2: pitch 17
        self.dw16 = nn.Conv2d(4, 4, 5, padding=2, groups=4)                # 16 wide: a vector per row, kept

    def forward(self, small, mid, wide):
        return (torch.nn.functional.hardswish(self.dw5(small)), self.dw7(mid[:, :4]), self.dwd(small),
                self.dws(mid), self.dw16(wide))


def _inputs(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 6, 7, 7, generator=g), torch.randn(batch, 6, 14, 14, generator=g),
            torch.randn(batch, 4, 16, 16, generator=g))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    batch = {0: ("batch", 1, 8)}
    return exported_with_source(_Windows().eval(), _inputs(2), {"small": batch, "mid": batch, "wide": batch},
                                tmp_path_factory.mktemp("planes"))


def test_short_rows_run_along_the_padded_rows(package):
    _, cpp = package
    planes = re.findall(r"static void (k\d+_\w+_plane\d*)\(", cpp)
    assert len(planes) == 4, planes  # dw5, dw7, dwd, dws; not the 16-wide one
    for name in planes:  # one loop over the plane: (H - 1) * P + W positions, each tap at a fixed offset
        body = cpp.split(f"static void {name}(", 1)[1].split("\n}\n", 1)[0]
        # a plain loop, or overlapping 16-wide chunks of it (cpu/codegen.py: overlap_width)
        lengths = {int(n) for n in re.findall(r"for \(int64_t (?:o\d+|tc_c) = 0; (?:o\d+|tc_c) < (\d+);", body)}
        assert lengths & {6 * 11 + 7, 13 * 20 + 14, 6 * 17 + 7}, (name, lengths)
        assert "tc_keep" not in body and "std::max" not in body and "tc_edge" not in body, name


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_matches_eager(package, batch):
    model, _ = package
    xs = _inputs(batch, seed=batch)
    with torch.no_grad():
        want = _Windows().eval()(*xs)
    got = model(*[x.numpy() for x in xs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)
