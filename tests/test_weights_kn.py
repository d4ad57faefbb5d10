"""Linear weights stored [K, N] at export for a GPU target (exporter/front/weights_kn.py).

Checked on the captured program (torch runs the rewritten graph, so a wrong layout shows up as a wrong number or a
failed validation), for what must stay (a weight tied to an embedding, a weight read elsewhere too; a CPU-only
package stores panels instead), through autocast's casts, and end to end: a package with a GPU target whose
kernels run in Triton's interpreter and whose CPU part runs torch-free.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import tcexport.loader as L
from tcexport.exporter import export
from tcexport.exporter.front.capture import decomposition_table
from tcexport.exporter.front.weights_kn import weights_kn

aten = torch.ops.aten


class Net(nn.Module):
    """Two private linears, one whose weight is also read outside its GEMM, one whose 13 columns make rows of no
    whole 16 bytes, and a head tied to an embedding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.a, self.b = nn.Linear(16, 24), nn.Linear(24, 16, bias=False)
        self.c, self.d = nn.Linear(16, 8), nn.Linear(16, 13)
        self.head = nn.Linear(16, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids, x):
        h = self.b(torch.relu(self.a(x))) + self.embed(ids)
        return self.head(h), self.c(h) + self.c.weight.sum(), self.d(h)


def _inputs(batch: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 20, (batch,), generator=g), torch.randn(batch, 16, generator=g)


def _captured(module: nn.Module, *args):
    with torch.no_grad():
        ep = torch.export.export(module.eval(), args, strict=False)
    return ep.run_decompositions(decomposition_table())


def _permuted_constants(ep) -> int:
    return sum(n.op == "call_function" and n.target is aten.permute.default and n.args[0].op == "placeholder"
               for n in ep.graph.nodes)


def test_private_weights_are_stored_transposed_and_the_program_still_computes_the_model():
    torch.manual_seed(0)
    m, args = Net().eval(), _inputs()
    ep = _captured(m, *args)
    before = _permuted_constants(ep)
    notes = weights_kn(ep)
    assert len(notes) == 1 and notes[0].startswith("2 linear weights stored [K, N]"), notes
    assert _permuted_constants(ep) == before - 2
    keys = set(ep.state_dict) | set(ep.constants)
    assert {"a.weight.T", "b.weight.T", "c.weight", "d.weight", "embed.weight"} <= keys, keys
    assert not {"a.weight", "b.weight", "c.weight.T", "d.weight.T"} & keys
    assert tuple(ep.constants["a.weight.T"].shape) == (16, 24) and ep.constants["a.weight.T"].is_contiguous()
    ep.validate()
    with torch.no_grad():
        for got, want in zip(ep.module()(*args), m(*args)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_weight_behind_autocasts_cast_moves_with_its_cast():
    """Under autocast a bf16 GEMM reads ``permute(_to_copy(w))``: the stored weight keeps its dtype and the cast
    reads it, [K, N]."""

    class Cast(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 4))

        def forward(self, x):
            return x.to(torch.bfloat16) @ self.w.to(torch.bfloat16).t()

    m, x = Cast().eval(), torch.randn(3, 4)
    ep = _captured(m, x)
    assert len(weights_kn(ep)) == 1
    assert ep.constants["w.T"].dtype == torch.float32 and tuple(ep.constants["w.T"].shape) == (4, 8)
    ep.validate()
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), m(x))


def test_nothing_to_move_changes_nothing():
    m = nn.Sequential(nn.Embedding(5, 4)).eval()
    ep = _captured(m, torch.tensor([1, 2]))
    assert weights_kn(ep) == []


@pytest.fixture(scope="module")
def gpu_package(tmp_path_factory):
    torch.manual_seed(1)
    m = Net().eval()
    dump = tmp_path_factory.mktemp("weights-kn") / "dump"
    pkg = export(m, _inputs(2), {"ids": {0: ("batch", 1, 8)}, "x": {0: ("batch", 1, 8)}},
                 targets=("cpu", "cuda:sm_90"), dump=dump, build_cubins=False)
    return m, pkg.save(dump.parent / "net.tcpkg"), dump


def test_a_gpu_package_holds_the_transposed_weights_and_says_so(gpu_package):
    _, path, dump = gpu_package
    weights = {w.name: w for w in L.load(path).manifest.weights}
    assert {"a.weight.T", "b.weight.T", "head.weight", "c.weight"} <= set(weights), sorted(weights)
    assert "2 linear weights stored [K, N]" in (dump / "graph.txt").read_text()


def test_a_cpu_package_holds_no_transposed_weights(tmp_path):
    """A CPU-only package stores its linears as the CPU GEMM's panels instead (test_weights_panels.py)."""
    pkg = export(Net().eval(), _inputs(2), {"ids": {0: ("batch", 1, 8)}, "x": {0: ("batch", 1, 8)}})
    weights = {w.name for w in L.load(pkg.save(tmp_path / "cpu.tcpkg")).manifest.weights}
    assert {"a.weight.panels", "b.weight.panels"} <= weights and not {"a.weight.T", "b.weight.T"} & weights


@pytest.mark.parametrize("batch", [1, 5])
def test_the_gpu_package_matches_eager(gpu_package, batch):
    """Torch-free on the CPU, and the GPU kernels in Triton's interpreter."""
    from tcexport.exporter.check.interpret import run_interpreted

    m, path, _ = gpu_package
    ids, x = _inputs(batch, seed=batch)
    with torch.no_grad():
        want = [w.numpy() for w in m(ids, x)]
    for got in (L.load(path)(ids.numpy(), x.numpy()), run_interpreted(path, [[ids.numpy(), x.numpy()]])[0]):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)
