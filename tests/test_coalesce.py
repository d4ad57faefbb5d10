"""Pointwise loops over a small map run as one loop over its positions on the CPU (exporter/schedule/coalesce.py):
a kernel and a GEMM epilogue over [batch, C, 7, 7] loop 49 long where every read moves with the map's position
as a whole, and keep their rows where one read moves with the rows alone; every batch still matches eager."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from packages import exported_with_source


class _SmallMaps(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.pw = nn.Conv2d(6, 10, 1)                        # 7x7 map: a GEMM whose epilogue adds a bias, hardswish
        self.scale = nn.Parameter(torch.randn(1, 10, 1, 1))  # per channel: read along neither map dim
        self.by_row = nn.Parameter(torch.randn(7, 1))        # per map row: keeps the rows apart

    def forward(self, x, r):
        return torch.nn.functional.hardswish(self.pw(x)), torch.sigmoid(r * self.scale + 1), x * self.by_row


def _inputs(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 6, 7, 7, generator=g), torch.randn(batch, 10, 7, 7, generator=g)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    batch = {0: ("batch", 1, 8)}
    return exported_with_source(_SmallMaps().eval(), _inputs(2), {"x": batch, "r": batch},
                                tmp_path_factory.mktemp("coalesce"))


def _loops(cpp: str, name_part: str) -> dict:
    """kernel name -> the extents of its for loops"""
    out = {}
    for name in re.findall(rf"static void (k\d+_{name_part}\w*)\(", cpp):
        body = cpp.split(f"static void {name}(", 1)[1].split("\n}\n", 1)[0]
        out[name] = {int(n) for n in re.findall(r"for \(int64_t \w+ = 0; \w+ < (\d+); \+\+\w+\)", body)}
    return out


def test_a_whole_map_is_one_loop(package):
    _, cpp = package
    gemm = _loops(cpp, "gemm")
    assert len(gemm) == 1 and 49 in next(iter(gemm.values())), gemm  # bias + hardswish over the map's 49 positions
    pointwise = _loops(cpp, "pointwise")
    merged = [n for n, lengths in pointwise.items() if 49 in lengths]
    kept = [n for n, lengths in pointwise.items() if 7 in lengths and 49 not in lengths]
    assert merged and kept, pointwise  # sigmoid(r * scale + 1) merged; x * by_row, read per row, kept


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_matches_eager(package, batch):
    model, _ = package
    xs = _inputs(batch, seed=batch)
    with torch.no_grad():
        want = _SmallMaps().eval()(*xs)
    for got, w in zip(model(*[x.numpy() for x in xs]), want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-6)
