"""A pure pointwise loop whose length leaves GCC scalar iterations runs as overlapping 16-wide chunks on the CPU
(cpu/codegen.py: overlap_width, _overlapped): a 5x5 depthwise convolution over 28-wide rows, read from its
zero-padded copy, is chunked at 0 and 12 and still matches eager at every batch; rows of 56 (whole vectors and
one 8-lane one) and a stride-2 window's rows of 30 (strided reads) keep their plain loop."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from packages import exported_with_source
from tcexport.exporter.cpu.codegen import overlap_width

CHUNKS = re.compile(r"for \(int64_t tc_c = 0; tc_c < (\d+); tc_c \+= 16\)")


class _Windows(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.dw28 = nn.Conv2d(8, 8, 5, padding=2, groups=8)             # rows of 28: chunked
        self.dw56 = nn.Conv2d(8, 8, 5, padding=2, groups=8)             # rows of 56: plain
        self.down = nn.Conv2d(8, 8, 5, stride=2, padding=2, groups=8)   # stride 2 onto rows of 30: plain

    def forward(self, x, y, z):
        return torch.relu(self.dw28(x)) * 2, self.dw56(y), self.down(z)


def _inputs(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 8, 28, 28, generator=g), torch.randn(batch, 8, 56, 56, generator=g),
            torch.randn(batch, 8, 60, 60, generator=g))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    batch = {0: ("batch", 1, 8)}
    return exported_with_source(_Windows().eval(), _inputs(2), {"x": batch, "y": batch, "z": batch},
                                tmp_path_factory.mktemp("overlap"))


def test_overlap_width():
    assert overlap_width(28) == 16 and overlap_width(30) == 16 and overlap_width(196) == 16
    # whole vectors and at most one 8-lane one and one scalar, a single vector, a symbol: left to GCC
    for n in (16, 32, 40, 49, 56, 112, 113, 14, 7):
        assert overlap_width(n) is None, n
    import sympy
    assert overlap_width(sympy.Symbol("s", positive=True, integer=True)) is None


def test_only_unit_stride_rows_of_28_are_chunked(package):
    _, cpp = package
    bodies = {name: cpp.split(f"static void {name}(", 1)[1].split("\n}\n", 1)[0]
              for name in re.findall(r"static void (k\d+\w*)\(", cpp)}
    chunked = {n: CHUNKS.findall(b) for n, b in bodies.items() if CHUNKS.search(b)}
    assert chunked and all(lengths == ["28"] for lengths in chunked.values()), chunked
    # the chunked kernels read their windows at unit stride (the padded copy, 32 wide), never at a stride of 2
    assert not any(re.search(r"\(2 \* o\d\)", bodies[n]) for n in chunked), chunked
    strided = [n for n, b in bodies.items() if re.search(r"\(2 \* o\d\)", b)]
    assert strided and re.search(r"o3 < 30;", "".join(bodies[n] for n in strided)), strided  # rows of 30, plain


@pytest.mark.parametrize("batch", [1, 3])
def test_matches_eager(package, batch):
    model, _ = package
    xs = _inputs(batch, seed=batch)
    with torch.no_grad():
        want = _Windows().eval()(*xs)
    for got, w in zip(model(*[x.numpy() for x in xs]), want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-5)
