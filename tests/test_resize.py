"""Resizing (``F.interpolate``, bilinear and nearest) exports: decomposed into gathers at computed indices and a
weighted sum (front/capture.py). Segmentation heads upsample their logits to the input's size this way; BEiT
resizes its relative position table with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tcexport.loader as L
from tcexport.exporter import export
from packages import WORK

pytestmark = pytest.mark.slow


class _Resize(nn.Module):
    def forward(self, x):
        up = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        small = F.avg_pool2d(x, 2)  # a segmentation head's way back to the input's size
        fixed = F.interpolate(small, size=x.shape[-2:], mode="bilinear", align_corners=False)
        near = F.interpolate(x, scale_factor=2, mode="nearest")
        return up + near, fixed


def test_bilinear_and_nearest_match_eager_at_dynamic_sizes():
    x = torch.randn(2, 3, 6, 6)
    path = WORK / "resize.tcpkg"
    export(_Resize(), (x,), {"x": {0: ("batch", 1, 4), 2: ("h", 4, 16), 3: ("w", 4, 16)}}, name="resize",
           cache_dir=WORK / "cache").save(path)
    model = L.load(path)
    for shape in [(1, 3, 4, 4), (3, 3, 5, 9), (4, 3, 16, 16)]:
        x = np.random.default_rng(shape[2]).standard_normal(shape, dtype=np.float32)
        got = model(x)
        want = _Resize()(torch.from_numpy(x))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)
