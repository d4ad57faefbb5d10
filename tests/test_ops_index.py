"""Indexing, concatenation, creation and mask ops through the whole pipeline against eager, one package."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import tcexport.loader as L

pytestmark = pytest.mark.slow


class Ops(torch.nn.Module):
    def forward(self, x, idx):
        s = x.shape[1]
        parts = torch.cat([x[:, -3:], x[:, 1:s - 1], x[:, 2:]], dim=1) * 2  # slices with symbolic ends
        return (parts,
                torch.tril(torch.ones(s, s)), torch.triu(x, 1), torch.cumsum(x, 1), x.pow(2),
                torch.gather(x, 1, idx.clamp(0, 3)),
                torch.index_select(x, 1, idx[0].clamp(0, 3)),
                x[idx.clamp(-1, 0), :2],  # advanced indexing with negative (wrapping) indices
                torch.arange(s, dtype=torch.float32) * 0.5, torch.full_like(x, 3.0),
                (x > 0).any(-1), (x > -5).all(-1),
                torch.where(x > 0, x, torch.zeros(1)))


@functools.lru_cache(maxsize=None)
def _package():
    from tcexport.exporter.pipeline import export

    x, idx = torch.randn(3, 9), torch.randint(0, 4, (3, 5))
    pkg = export(Ops(), (x, idx), {"x": {0: ("b", 1, 8), 1: ("s", 4, 64)}, "idx": {0: ("b", 1, 8)}})
    path = Path(tempfile.mkdtemp(prefix="tcexport-ops-")) / "ops.tcpkg"
    pkg.save(path)
    return L.load(path)


@pytest.mark.parametrize("shape", [(3, 9), (1, 4), (8, 64), (2, 5)])
def test_index_ops_match_eager(shape):
    gen = torch.Generator().manual_seed(shape[0] * 100 + shape[1])
    x = torch.randn(*shape, generator=gen)
    idx = torch.randint(-2, 6, (shape[0], 5), generator=gen)
    got = _package()(x.numpy(), idx.numpy())
    want = Ops()(x, idx)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == tuple(w.shape) and g.dtype == w.numpy().dtype, k
        np.testing.assert_allclose(g, w.numpy(), atol=1e-5, rtol=1e-5, err_msg=f"output {k}")


class Advanced(torch.nn.Module):
    def forward(self, x, i, j):
        return (x[:, i, j], x[i, :, j], x[:, i], x[i, j], x[..., j.clamp(0, 4)],
                torch.nn.functional.embedding(i.clamp(0, 4), x[0]))


def test_advanced_indexing_layouts_match_eager():
    """Adjacent index tensors replace their dims in place; separated ones move to the front (NumPy rule)."""
    from tcexport.exporter.pipeline import export

    x, i, j = torch.randn(4, 5, 6), torch.tensor([[0, 1, 3], [2, -1, 0]]), torch.tensor([1, 4, -2])
    path = Path(tempfile.mkdtemp(prefix="tcexport-ops-")) / "advanced.tcpkg"
    export(Advanced(), (x, i, j), None).save(path)
    got = L.load(path)(x.numpy(), i.numpy(), j.numpy())
    for k, (g, w) in enumerate(zip(got, Advanced()(x, i, j))):
        np.testing.assert_array_equal(g, w.numpy(), err_msg=f"output {k}")
