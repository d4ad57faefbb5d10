"""Weights keep their shapes in the archive: a 0-d parameter, a 0-d buffer and a lifted 0-d constant (Gemma's
``embed_scale``, DeBERTa-v2's and Swin's scalars) are stored 0-d, so the loader's manifest check accepts them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import tcexport.loader as L
from tcexport.exporter import export
from packages import WORK

pytestmark = pytest.mark.slow


class _Scalars(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor(2.0), persistent=False)
        self.shift = nn.Parameter(torch.tensor(0.5))
        self.lifted = torch.tensor(3.0)  # neither parameter nor buffer: torch.export lifts it as a constant

    def forward(self, x):
        return x * self.scale + self.shift - self.lifted


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_dim_weights_stay_zero_dim(dtype):
    module = _Scalars().to(dtype).eval()
    module.lifted = module.lifted.to(dtype)
    x = torch.randn(3, 4).to(dtype)
    pkg = export(module, (x,), {"x": {0: ("batch", 1, 8)}}, name="scalars", cache_dir=WORK / "cache")
    assert sorted(w.shape for w in pkg.manifest.weights) == [(), (), ()]
    path = WORK / f"scalars-{str(dtype)[6:]}.tcpkg"
    pkg.save(path)
    model = L.load(path)
    if dtype == torch.float32:
        got = model(x.numpy())
        np.testing.assert_allclose(got, module(x).detach().numpy(), rtol=1e-6)
