"""A window sum with many taps at its rows' edges (a depthwise convolution over a small map) reads a zero-padded
copy of its input on the CPU (exporter/schedule/pad_windows.py): its taps become plain loads, and every shape
still matches eager. The GPU keeps the kernel as it was."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
import torch
from torch import nn

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.schedule.pad_windows import tap
from packages import exported_with_source

pytestmark = pytest.mark.slow


class _Depthwise(nn.Module):
    """MobileNet's and ConvNeXt's windows on small maps (copied), and a 3x3 on a wide one (not worth a copy)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.dw5 = nn.Conv2d(6, 6, 5, padding=2, groups=6)                 # 7 wide: copied
        self.dw5s = nn.Conv2d(6, 6, 5, stride=2, padding=2, groups=6)      # 14 -> 7 wide: copied
        self.dwd = nn.Conv2d(6, 12, 3, padding=2, dilation=2, groups=6)    # two outputs per channel: copied
        self.dw7 = nn.Conv2d(4, 4, 7, padding=3, groups=4)                 # ConvNeXt's 7x7 at 14: copied
        self.dw3 = nn.Conv2d(4, 4, 3, padding=1, groups=4)                 # 48 wide: kept

    def forward(self, small, mid, wide):
        a = self.dw5(torch.relu(small)) + self.dw5s(mid)
        return self.dwd(a), self.dw7(mid[:, :4]), self.dw3(wide)


def _inputs(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 6, 7, 7, generator=g), torch.randn(batch, 6, 14, 14, generator=g),
            torch.randn(batch, 4, 48, 48, generator=g))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    batch = {0: ("batch", 1, 8)}
    return exported_with_source(_Depthwise().eval(), _inputs(2), {"small": batch, "mid": batch, "wide": batch},
                                tmp_path_factory.mktemp("pad"))


def test_small_maps_read_a_padded_copy_and_wide_ones_do_not(package):
    _, cpp = package
    copies = sorted({line.split("(")[0].split()[-1] for line in cpp.splitlines()
                     if line.startswith("static void") and "_pad" in line})
    assert len(copies) == 4, copies  # dw5 (of relu(small)) and dw5s (one kernel, two copies), dwd, dw7; not dw3
    padded_kernels = {c.split("_pad")[0] for c in copies}
    for name in padded_kernels:   # the window kernel itself: no select, no clamp, no edge path
        body = cpp.split(f"static void {name}(", 1)[1].split("\n}\n", 1)[0]
        assert "tc_keep" not in body and "std::max" not in body and "tc_edge" not in body, name


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_matches_eager(package, batch):
    model, _ = package
    xs = _inputs(batch, seed=batch)
    with torch.no_grad():
        want = _Depthwise().eval()(*xs)
    got = model(*[x.numpy() for x in xs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)


def test_a_select_with_any_other_condition_is_not_a_tap():
    """Only ``where(bounds of its clamps, x[clamped], 0)`` is read from the copy: a select that also tests a value
    (a masked_fill after the window) or that fills with another value is left alone."""
    i = ir.ivar(1)
    prog = ir.Program({"x": ir.Buffer("x", "float32", (sympy.Integer(7),), "input")}, [], ["x"], [], [])
    load = ir.Load("float32", "x", (sympy.Max(i - 2, 0),))
    inside = ir.Op("bool", "ge", (ir.IndexValue("int64", i - 2), ir.Const("int64", 0)))
    assert tap(prog, ir.Op("float32", "where", (inside, load, ir.Const("float32", 0.0)))) is not None
    other = ir.Op("bool", "logical_and", (inside, ir.Op("bool", "gt", (load, ir.Const("float32", 0.0)))))
    assert tap(prog, ir.Op("float32", "where", (other, load, ir.Const("float32", 0.0)))) is None
    assert tap(prog, ir.Op("float32", "where", (inside, load, ir.Const("float32", -1.0)))) is None
    shifted = ir.Op("bool", "ge", (ir.IndexValue("int64", i - 1), ir.Const("int64", 0)))
    assert tap(prog, ir.Op("float32", "where", (shifted, load, ir.Const("float32", 0.0)))) is None


class _ChannelsLast(nn.Module):
    """ConvNeXt's first block: a 7x7 depthwise layer over a map its stem left channels-last ([n, h, w, c])."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.dw = nn.Conv2d(8, 8, 7, padding=3, groups=8)

    def forward(self, x):
        return self.dw(torch.relu(x).permute(0, 3, 1, 2))


def test_a_window_over_a_permuted_map_reads_a_copy_laid_out_as_it_walks(tmp_path):
    """The copy is [n, c, h + 6, w + 6], the order the window walks, not x's [n, h, w, c]: its taps are then plain
    loads along the row and the edge taps count along w, so it is copied at all."""
    model, cpp = exported_with_source(_ChannelsLast().eval(), (torch.randn(2, 14, 14, 8),),
                                      {"x": {0: ("batch", 1, 8)}}, tmp_path)
    copies = [line for line in cpp.splitlines() if line.startswith("static void") and "_pad" in line]
    assert len(copies) == 1, copies
    window = copies[0].split("(")[0].split()[-1].split("_pad")[0]
    body = cpp.split(f"static void {window}(", 1)[1].split("\n}\n", 1)[0]
    assert "tc_keep" not in body and "std::max" not in body and "tc_edge" not in body
    assert "_pad [loops] outer=[batch, 8, 20, 20] inner=[]" in cpp  # the copy's own loops, over its layout
    for batch in (1, 5):
        x = torch.randn(batch, 14, 14, 8, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            want = _ChannelsLast().eval()(x)
        np.testing.assert_allclose(model(x.numpy()), want.numpy(), rtol=1e-5, atol=1e-5)
