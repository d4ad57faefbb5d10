"""An index read from a constant (token-type ids that are all zeros, as BERT-style models make them when none are
passed) renders in both backends: it was spliced into the index expression as a symbol named after its text
(``s_static_cast<int64_t>(0LL)``), which no compiler accepts (DeBERTa-v2 in the zoo)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import tcexport.loader as L
from tcexport.exporter import export
from packages import WORK

pytestmark = pytest.mark.slow


class _ZeroTypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.words, self.types = nn.Embedding(16, 8), nn.Embedding(2, 8)

    def forward(self, ids):
        return self.words(ids) + self.types(torch.zeros_like(ids))


def _case():
    torch.manual_seed(0)
    module = _ZeroTypes().eval()
    ids = torch.randint(0, 16, (2, 5))
    return module, ids


def test_constant_index_on_the_cpu():
    module, ids = _case()
    path = WORK / "zero-types.tcpkg"
    export(module, (ids,), {"ids": {0: ("batch", 1, 4), 1: ("seq", 1, 8)}}, name="zero_types",
           cache_dir=WORK / "cache").save(path)
    x = np.array([[3, 1, 15], [0, 7, 2]], dtype=np.int64)
    np.testing.assert_allclose(L.load(path)(x), module(torch.from_numpy(x)).detach().numpy(), rtol=1e-6)


def test_constant_index_in_triton():
    pytest.importorskip("triton")
    from tcexport.exporter.check.interpret import run_interpreted

    module, ids = _case()
    path = WORK / "zero-types-cuda.tcpkg"
    export(module, (ids,), {"ids": {0: ("batch", 1, 4), 1: ("seq", 1, 8)}}, "cuda:sm_90", name="zero_types",
           cache_dir=WORK / "cache", build_cubins=False).save(path)
    x = np.array([[3, 1, 15], [0, 7, 2]], dtype=np.int64)
    (got,), = run_interpreted(path, [[x]])
    np.testing.assert_allclose(got, module(torch.from_numpy(x)).detach().numpy(), rtol=1e-6)
