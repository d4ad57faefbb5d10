"""A GEMM operand read through an im2col view (a stride-2 convolution over an explicitly padded input, as
EfficientNet-b0's stem; a patchifying convolution, as ConvNeXt's) is gathered by the CPU kernel into scratch before
the product (cpu/codegen.py: _gathered). Its columns are the output's positions, read as col // W and col % W: the
gather runs over rows of W (column_split), with no division per element, into scratch kept by the calling thread
between calls (runtime/prelude.h: tc_call_scratch), and every batch, larger and smaller in turn, matches eager."""

from __future__ import annotations

import re

import numpy as np
import pytest
import sympy
import torch
from torch import nn
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from packages import exported_with_source
from tcexport.exporter.cpu.codegen import column_split


class _Stems(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 8, 3, stride=2)            # over a padded input: an im2col view, 14 x 14 out
        self.patch = nn.Conv2d(8, 16, 2, stride=2)          # patchify: 7 x 7 out

    def forward(self, x):
        y = torch.relu(self.stem(nn.functional.pad(x, (0, 1, 0, 1))))
        return y, self.patch(y)


def _inputs(batch, seed=0):
    return (torch.randn(batch, 3, 28, 28, generator=torch.Generator().manual_seed(seed)),)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return exported_with_source(_Stems().eval(), _inputs(2), {"x": {0: ("batch", 1, 8)}},
                                tmp_path_factory.mktemp("gather"))


def test_column_split():
    col, row = sympy.Symbol("i2", integer=True, nonnegative=True), sympy.Symbol("i1", integer=True, nonnegative=True)
    flat = 450 * FloorDiv(col, 112) + 2 * ModularIndexing(col, 1, 112) + 7 * row
    out, d = column_split(flat, col, 12544)
    i3, i4 = sympy.Symbol("i3", integer=True, nonnegative=True), sympy.Symbol("i4", integer=True, nonnegative=True)
    assert d == 112 and sympy.expand(out - (450 * i3 + 2 * i4 + 7 * row)) == 0
    assert column_split(flat, col, 12545) is None                               # 112 does not divide the columns
    assert column_split(flat + FloorDiv(col, 7), col, 12544) is None            # two divisors
    assert column_split(flat + col, col, 12544) is None                         # the column read as it is too
    assert column_split(3 * col + row, col, 12544) is None                      # no division at all


def test_the_gathers_run_along_rows(package):
    _, cpp = package
    gathers = re.findall(r"tc_g[ab]\[[^\n]*", cpp)
    assert len(gathers) == 2, gathers
    for line in gathers:
        assert "i3" in line and "i4" in line and "(i2" not in line, line
    assert "std::vector<float> tc_g" not in cpp and cpp.count("tc_call_scratch<float, 1>") == 2


def test_matches_eager_as_the_batch_grows_and_shrinks(package):
    model, _ = package
    for batch in (1, 3, 8, 2):
        xs = _inputs(batch, seed=batch)
        with torch.no_grad():
            want = _Stems().eval()(*xs)
        for got, w in zip(model(*[x.numpy() for x in xs]), want):
            np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-5)
