"""Pointwise loops over a small map run as one loop over its positions on the CPU (exporter/schedule/coalesce.py):
a kernel and a GEMM epilogue over [batch, C, 7, 7] loop 49 long where every read moves with the map's position
as a whole (a transposing read too), never merge the channels in (at batch 1 the pool would get one piece), and
keep their rows where one read moves with the rows alone; a mean over the map sums one loop of 49; every batch still matches eager, in float32 and with a
bfloat16 GEMM whose product goes through float32 scratch."""

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
        self.pw = nn.Conv2d(6, 16, 1)                        # 7x7 map: a GEMM whose epilogue adds a bias, hardswish
        self.scale = nn.Parameter(torch.randn(1, 16, 1, 1))  # per channel: read along neither map dim
        self.by_row = nn.Parameter(torch.randn(7, 1))        # per map row: keeps the rows apart

    def forward(self, x, r, cl):
        return (torch.nn.functional.hardswish(self.pw(x)), torch.sigmoid(r * self.scale + 1), x * self.by_row,
                cl.permute(0, 3, 1, 2) + 1,  # a channels-last map into NCHW: its positions read 16 floats apart
                (r * 2).mean((2, 3)))        # a pooled mean: its inner loops, 7 and 7, as one of 49


def _inputs(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 6, 7, 7, generator=g), torch.randn(batch, 16, 7, 7, generator=g),
            torch.randn(batch, 7, 7, 16, generator=g))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    batch = {0: ("batch", 1, 8)}
    return exported_with_source(_SmallMaps().eval(), _inputs(2), {"x": batch, "r": batch, "cl": batch},
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
    assert merged and kept, pointwise  # sigmoid(r * scale + 1) and the transpose merged; x * by_row kept
    bodies = [cpp.split(f"static void {n}(", 1)[1].split("\n}\n", 1)[0] for n in merged]
    assert any(re.search(r"\(16 \* o2\)", b) for b in bodies), bodies  # the channels-last read, 16 floats apart
    assert not any(16 * 49 in lengths for lengths in {**gemm, **pointwise}.values()), (gemm, pointwise)
    reduce = _loops(cpp, "reduce")
    assert any(49 in lengths and 7 not in lengths for lengths in reduce.values()), reduce


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_matches_eager(package, batch):
    model, _ = package
    xs = _inputs(batch, seed=batch)
    with torch.no_grad():
        want = _SmallMaps().eval()(*xs)
    for got, w in zip(model(*[x.numpy() for x in xs]), want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-6)


def test_a_bfloat16_product_through_scratch_matches_eager(tmp_path):
    from tcexport.loader.dtypes import numpy_dtype

    module = _SmallMaps().eval().to(torch.bfloat16)
    batch = {0: ("batch", 1, 8)}
    xs = tuple(x.to(torch.bfloat16) for x in _inputs(2))
    model, cpp = exported_with_source(module, xs, {"x": batch, "r": batch, "cl": batch}, tmp_path)
    assert "tc_acc" in cpp and 49 in next(iter(_loops(cpp, "gemm").values()))
    bf16 = numpy_dtype("bfloat16")
    xs = tuple(x.to(torch.bfloat16) for x in _inputs(3, seed=3))
    with torch.no_grad():
        want = module(*xs)
    got = model(*[x.view(torch.int16).numpy().view(bf16) for x in xs])
    for g, w in zip(got, want):
        g = torch.from_numpy(np.ascontiguousarray(g).view(np.int16)).view(torch.bfloat16)
        torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2)
