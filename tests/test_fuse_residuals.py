"""Residual streams through fusion: a residual add becomes its GEMM's epilogue even when the batch is a size-1
dim, and a chain of residual adds that cannot be epilogues is kept in memory instead of being re-added by every
later layer (fuse._same_element_loads, fuse._rereads_pay)."""

from __future__ import annotations

import re

import numpy as np
import torch

from tcexport.exporter import export
from tcexport.loader import load


class Residual(torch.nn.Module):
    """Pre-norm blocks: x = x + linear(norm(x)), as every decoder LM's attention and MLP outputs are added."""

    def __init__(self, layers=4, d=32):
        super().__init__()
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(d) for _ in range(layers))
        self.linears = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))

    def forward(self, x):
        for norm, linear in zip(self.norms, self.linears):
            x = x + linear(norm(x))
        return x


class Tapped(Residual):
    """The same blocks with every GEMM output also returned: no add can be its GEMM's epilogue."""

    def forward(self, x):
        taps = []
        for norm, linear in zip(self.norms, self.linears):
            y = linear(norm(x))
            taps.append(y)
            x = x + y
        return (x, *taps)


def _kernels(dump) -> list[str]:
    text = (dump / "kernels.txt").read_text().split("kernels:", 1)[1]
    return re.split(r"\n(?=k\d+_)", text.strip())


def _reads(kernel: str) -> set[str]:
    """The intermediate and output buffers a kernel reads that it does not compute itself."""
    lines = kernel.splitlines()[1:]
    computed = {m.group(1) for line in lines for m in [re.match(r"\s*\w+\s+n\d+: (\w+)\[", line)] if m}
    read = {name for line in lines for name in re.findall(r"\b((?:buf|out_)\w*)\[", line.split(" = ", 1)[1])}
    return read - computed


def _check(model, x, dyn, tmp_path):
    torch.manual_seed(0)
    pkg = export(model.eval(), (x,), dyn, dump=tmp_path / "dump")
    m = load(pkg.save(tmp_path / "m.tcpkg"))
    want = model(x)
    want = want if isinstance(want, tuple) else (want,)
    got = m(x.numpy())
    got = got if isinstance(got, (tuple, list)) else (got,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w.detach().numpy(), rtol=1e-4, atol=1e-5)
    return _kernels(tmp_path / "dump")


def test_a_batch_one_residual_add_is_its_gemms_epilogue(tmp_path):
    """[1, seq, d] + the GEMM's [seq, d]: element for element once the size-1 batch index is 0."""
    torch.manual_seed(0)
    kernels = _check(Residual(), torch.randn(1, 6, 32), {"x": {1: ("seq", 1, 64)}}, tmp_path)
    gemms = [k for k in kernels if "[gemm]" in k.splitlines()[0]]
    assert len(gemms) == 4 and all(" then add(" in k for k in gemms), "\n".join(kernels)
    norms = [k for k in kernels if "reduce_sum" in k.splitlines()[0]]
    # each norm reads one stored residual, not a sum of every earlier layer's output
    assert norms and all(len(_reads(k)) <= 1 for k in norms), "\n".join(norms)


def test_residual_adds_that_cannot_be_epilogues_do_not_pile_up(tmp_path):
    """Each GEMM output is also a model output, so each add stays a pointwise node; the last norm must not
    re-add every earlier layer's output."""
    torch.manual_seed(0)
    layers = 8
    kernels = _check(Tapped(layers), torch.randn(3, 32), {"x": {0: ("batch", 1, 64)}}, tmp_path)
    assert max(len(_reads(k)) for k in kernels) <= 4, "\n".join(kernels)
