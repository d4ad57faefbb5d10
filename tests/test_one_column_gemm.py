"""A batched GEMM of one column over a shared left operand (a squeeze-excite block's 1x1 convolutions over the
pooled map) is lowered as one GEMM whose rows are the batch (exporter/lower/ops.py, _one_column_fold): the
weight is read once for every row, and the output's memory is the same. Checked on the CPU at several batches
and on the GPU side through Triton's interpreter; a 1x1 convolution over a wider map keeps its batched GEMM."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from packages import WORK, exported_with_source


class _SqueezeExcite(nn.Module):
    def __init__(self, c=24, squeezed=8):
        super().__init__()
        torch.manual_seed(0)
        self.expand = nn.Conv2d(8, c, 1)  # over the 5x5 map: a batched GEMM of 25 columns, kept
        self.fc1, self.fc2 = nn.Conv2d(c, squeezed, 1), nn.Conv2d(squeezed, c, 1)

    def forward(self, x):
        y = torch.relu(self.expand(x))
        s = torch.nn.functional.adaptive_avg_pool2d(y, 1)
        s = torch.nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))
        return y * s


class _SharedLeft(nn.Module):
    """bmm of a shared [m, k] weight (expanded: batch stride 0) and one column per batch read through a slice and
    a transpose ([B, 1, k + 2] -> [B, k, 1] at an offset of one)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.w = nn.Parameter(torch.randn(12, 20))

    def forward(self, v):
        col = v[:, :, 1:21].transpose(1, 2)
        return torch.relu(torch.bmm(self.w.expand(v.shape[0], 12, 20), col))


def _inputs(batch, seed=0):
    return (torch.randn(batch, 8, 5, 5, generator=torch.Generator().manual_seed(seed)),)


DYNAMIC = {"x": {0: ("batch", 1, 16)}}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one-column")
    model, _ = exported_with_source(_SqueezeExcite().eval(), _inputs(2), DYNAMIC, folder)
    return model, (folder / "dump" / "kernels.txt").read_text()


def test_the_pooled_convolutions_are_one_gemm_over_the_batch(package):
    _, kernels = package
    gemms = set(re.findall(r"gemm\(batch=(\w+), m=(\w+), n=(\w+), k=(\w+);", kernels))
    assert sorted(gemms) == sorted([("batch", "24", "25", "8"),      # the expansion: one GEMM per image
                                    ("1", "batch", "8", "24"), ("1", "batch", "24", "8")]), gemms
    # the weight is the right operand, read transposed (rows of K), as a Linear's
    assert re.search(r"m=batch, n=8, k=24; A=\w+\+0 strides\(b=0, r=24, c=1\); B=w_fc1_weight\+0 "
                     r"strides\(b=0, r=1, c=24\)", kernels), kernels


@pytest.mark.parametrize("batch", [1, 3, 16])
def test_matches_eager(package, batch):
    model, _ = package
    (x,) = _inputs(batch, seed=batch)
    with torch.no_grad():
        want = _SqueezeExcite().eval()(x)
    np.testing.assert_allclose(model(x.numpy()), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dynamic", [True, False])
def test_a_shared_left_bmm_over_a_strided_column_matches_eager(tmp_path, dynamic):
    """A dynamic batch, and a static batch of 1 (its single row's stride is k, whatever the batch stride)."""
    v = torch.randn(1 if not dynamic else 2, 1, 22, generator=torch.Generator().manual_seed(5))
    shapes = {"v": {0: ("batch", 1, 16)}} if dynamic else None
    model, _ = exported_with_source(_SharedLeft().eval(), (v,), shapes, tmp_path)
    kernels = (tmp_path / "dump" / "kernels.txt").read_text()
    assert re.search(r"gemm\(batch=1, m=(batch|1), n=12, k=20;", kernels), kernels
    for b in ((1, 3, 16) if dynamic else (1,)):
        x = torch.randn(b, 1, 22, generator=torch.Generator().manual_seed(b))
        with torch.no_grad():
            want = _SharedLeft().eval()(x)
        np.testing.assert_allclose(model(x.numpy()), want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_matches_eager_in_the_gpu_interpreter(tmp_path):
    pytest.importorskip("triton")
    from tcexport.exporter.check.interpret import run_interpreted
    from tcexport.exporter.pipeline import export

    module = _SqueezeExcite().eval()
    path = export(module, _inputs(2), DYNAMIC, "cuda:sm_90", name="se",
                  cache_dir=WORK / "cache-one-column").save(tmp_path / "se.tcpkg")
    xs = [_inputs(b, seed=b)[0] for b in (1, 5)]
    for x, (got,) in zip(xs, run_interpreted(path, [[x.numpy()] for x in xs])):
        with torch.no_grad():
            want = module(x)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"batch {x.shape[0]}")
