"""The innermost loop of a pointwise kernel split into edge, interior, edge (exporter/cpu/interior.py): the tests
a window makes at the input's edges are folded away in the interior, so gcc vectorises it, and every shape, the
ones whose interior is empty included, still matches eager."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
import torch
from torch import nn

from tcexport.exporter import export
from tcexport.exporter.cpu.interior import hoisted_clamps, interior, invariant_parts
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import ovar
from tcexport.loader import load
from packages import exported_with_source


def _window_tap(x: str, row, col, h, w) -> ir.Value:
    """x[o0, row, col], or 0 outside [0, h) x [0, w): what lower/conv.py's window_load writes."""
    conds = [ir.Op("bool", "ge", (ir.IndexValue("int64", row), ir.Const("int64", 0))),
             ir.Op("bool", "lt", (ir.IndexValue("int64", col), ir.IndexValue("int64", w))),
             ir.Op("bool", "ge", (ir.IndexValue("int64", col), ir.Const("int64", 0)))]
    cond = ir.Op("bool", "logical_and", (ir.Op("bool", "logical_and", tuple(conds[:2])), conds[2]))
    load = ir.Load("float32", x, (ovar(0), sympy.Max(row, 0), sympy.Min(sympy.Max(col, 0), w - 1)))
    return ir.Op("float32", "where", (cond, load, ir.Const("float32", 0.0)))


def test_the_interior_is_where_every_edge_test_holds_and_folds_them():
    o1, o2 = ovar(1), ovar(2)
    w = sympy.Symbol("width", integer=True, positive=True)
    body = ir.Op("float32", "add", (_window_tap("x", o1 - 1, 2 * o2 - 3, 9, w),
                                    ir.Op("float32", "mul", (_window_tap("x", o1 - 1, 2 * o2 + 1, 9, w),
                                                             ir.Load("float32", "k", (o1,))))))
    inside = interior([body], o2)
    # 2*o2 - 3 >= 0 from o2 = 2 on; 2*o2 + 1 <= width - 1 up to o2 = (width - 2) // 2
    for width in range(1, 12):
        lo, hi = int(inside.lo), int(inside.hi.subs(w, width))
        assert (lo, hi) == (2, (width - 2) // 2 + 1), width
        assert all((2 * v - 3 >= 0) and (2 * v + 1 <= width - 1) for v in range(lo, hi))
    text = str(inside.bodies[0])
    assert "lt(" not in text and "Min" not in text and "o2 - 3), 0" not in text, text
    assert "x[o0, Max(0, o1 - 1), 2*o2 - 3]" in text and "x[o0, Max(0, o1 - 1), 2*o2 + 1]" in text, text
    # the row test does not change along o2: it stays, computed before the loop with the weight
    parts = invariant_parts(inside.bodies[0], o2, written={"out"})
    assert ir.Load("float32", "k", (o1,)) in parts
    assert any("ge(index(o1 - 1), 0)" in str(p) for p in parts)
    assert not any("o2" in str(p) for p in parts)


def test_a_clamp_that_does_not_change_along_the_loop_is_computed_before_it():
    """The row clamp left in the interior's index (Max(0, o1 - 1)) becomes a name computed before the loop, so that
    the load is affine in o2 (gcc left the row of a stride-2 phase copy scalar while the clamp sat in the index);
    one clamp read twice is one name, and a name already in use (a load's, a shape symbol's) is not taken."""
    o1, o2 = ovar(1), ovar(2)
    taken, shape = sympy.Symbol("_h0", integer=True), sympy.Symbol("_h1", integer=True)
    extra = ir.Op("float32", "add", (ir.Load("float32", "y", (taken, o2)),
                                     ir.Op("float32", "cast", (ir.IndexValue("int64", shape),))))
    body = ir.Op("float32", "add", (_window_tap("x", o1 - 1, 2 * o2 - 3, 9, 20),
                                    ir.Op("float32", "add", (_window_tap("x", o1 - 1, 2 * o2 + 1, 9, 20), extra))))
    inside = interior([body], o2)
    bodies, clamps = hoisted_clamps(inside.bodies, o2)
    assert [(str(sym), e) for sym, e in clamps] == [("_h2", sympy.Max(0, o1 - 1))]
    text = str(bodies[0])
    assert "Max" not in text and "x[o0, _h2, 2*o2 - 3]" in text and "x[o0, _h2, 2*o2 + 1]" in text, text
    assert "y[_h0, o2]" in text
    assert hoisted_clamps(inside.bodies, o1)[1] == []  # along o1 the clamp changes: it stays


def test_a_loop_with_no_edge_test_or_a_test_it_cannot_solve_stays_whole():
    o2 = ovar(2)
    plain = ir.Load("float32", "x", (ovar(0), o2))
    assert interior([plain], o2) is None
    modular = ir.Op("float32", "where", (ir.Op("bool", "ge", (ir.IndexValue("int64", o2 * o2 - 4),
                                                              ir.Const("int64", 0))), plain, ir.Const("float32", 0.0)))
    inside = interior([modular], o2)
    assert inside is None or "where" in str(inside.bodies[0])


class _Windows(nn.Module):
    """Every kind of window edge: depthwise 3x3 / 5x5 (stride 1 and 2, dilation 2), a padded max pool, an
    asymmetric pad, and a causal mask built from positions."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.dw3 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.dw5 = nn.Conv2d(8, 8, 5, stride=2, padding=2, groups=8)
        self.dwd = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8)

    def forward(self, x):
        a = torch.relu(self.dw3(x))
        b = nn.functional.max_pool2d(a, 3, stride=1, padding=1)
        c = self.dwd(nn.functional.pad(b, (2, 1, 0, 3)))
        d = self.dw5(c)
        n = d.shape[-1]
        causal = torch.arange(n)[None, :] <= torch.arange(d.shape[-2])[:, None]
        return d.masked_fill(~causal, 0.0)


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    return exported_with_source(_Windows().eval(), (torch.randn(2, 8, 12, 12),),
                                {"x": {0: ("batch", 1, 4), 2: ("h", 1, 40), 3: ("w", 1, 40)}},
                                tmp_path_factory.mktemp("interior"))


def test_window_kernels_split_their_innermost_loop(windows):
    _, cpp = windows
    assert cpp.count("tc_edge(") >= 4 * 2, "each window kernel: an edge lambda called before and after"


@pytest.mark.parametrize("hw", [(1, 1), (2, 3), (3, 2), (5, 5), (12, 12), (7, 31), (40, 40)])
def test_every_size_matches_eager_including_an_empty_interior(windows, hw):
    model, _ = windows
    x = torch.randn(3, 8, *hw, generator=torch.Generator().manual_seed(hw[0] * 100 + hw[1]))
    with torch.no_grad():
        want = _Windows().eval()(x)
    got = model(x.numpy())
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


class _Keep(nn.Module):
    def forward(self, x):
        return torch.where(x > 0, x, 0.0) + nn.functional.pad(x, (1, 1)).sum(-1, keepdim=True)


def test_a_select_against_zero_keeps_every_bit(tmp_path):
    """``where(c, x, 0)`` renders as a bit mask (tc_keep): NaN, infinities and -0.0 come out as torch's select
    gives them, +0.0 where the condition fails."""
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1.5, -2.0, 3e-42] * 3] * 2)
    path = tmp_path / "keep.tcpkg"
    export(_Keep(), (x,), dynamic_shapes={"x": {0: ("batch", 1, 4)}}, cache_dir=tmp_path / "cache").save(path)
    got, want = load(path)(x.numpy()), _Keep()(x).numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (got, want)
