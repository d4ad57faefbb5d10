"""Linears over one input joined into one GEMM at export (exporter/front/concat_linears.py).

Checked on the captured program (torch runs the rewritten graph, so a wrong join shows up as a wrong number) and
end to end: an attention-like block with query/key/value projections (the key without a bias, as Whisper's),
a gated MLP, a tied weight that must stay apart, exported with a dynamic batch and sequence and run torch-free
on the CPU and, for the GPU kernels, in Triton's interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import tcexport.loader as L
from tcexport.exporter import export
from tcexport.exporter.front.capture import decomposition_table
from tcexport.exporter.front.concat_linears import braced, concat_linears
from packages import WORK

aten = torch.ops.aten
D, HIDDEN = 32, 48


class Block(nn.Module):
    """q/k/v over one normalised input (k without a bias), a gate and an up projection over another (their
    outputs meet in a product, the up GEMM's epilogue), a linear over a third input, and an output head tied to
    the embedding: q/k/v join, the rest stay."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, D)
        self.norm = nn.LayerNorm(D)
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, 16, bias=False), nn.Linear(D, 16)
        self.o = nn.Linear(32, D, bias=False)
        self.gate, self.up = nn.Linear(D, HIDDEN, bias=False), nn.Linear(D, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, D, bias=False)
        self.head = nn.Linear(D, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        att = torch.softmax(q[..., :16] @ k.transpose(-1, -2) / 4.0, dim=-1) @ v
        x = x + self.o(torch.cat([att, q[..., 16:]], dim=-1))
        h = self.norm(x)
        x = x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))
        return self.head(x), self.head(h)


def _captured(module: nn.Module, *args):
    with torch.no_grad():
        ep = torch.export.export(module.eval(), args, strict=False)
    return ep.run_decompositions(decomposition_table())


def _gemms(ep) -> int:
    return sum(n.op == "call_function" and n.target in (aten.mm.default, aten.addmm.default) for n in ep.graph.nodes)


def test_joins_the_linears_over_each_input_and_keeps_the_rest():
    torch.manual_seed(0)
    m, ids = Block().eval(), torch.randint(0, 50, (2, 7))
    ep = _captured(m, ids)
    before = _gemms(ep)
    notes = concat_linears(ep)
    assert notes == ["3 linears over one input are one GEMM: q.weight, k.weight, v.weight"], notes
    assert _gemms(ep) == before - 2
    keys = set(ep.state_dict) | set(ep.constants)
    assert {"{q,k,v}.weight", "{q,k,v}.bias", "gate.weight", "up.weight"} <= keys, keys
    assert not {"q.weight", "k.weight", "v.weight", "q.bias", "v.bias"} & keys
    assert "embed.weight" in keys  # tied to the head, read twice: never joined
    ep.validate()
    with torch.no_grad():
        for got, want in zip(ep.module()(ids), m(ids)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


class TwoHeads(nn.Module):
    """Two linears over one input, each its own output; ``read_weight`` also sums the first one's weight."""

    def __init__(self, read_weight: bool):
        super().__init__()
        self.a, self.b, self.read_weight = nn.Linear(8, 8), nn.Linear(8, 4), read_weight

    def forward(self, x):
        extra = self.a.weight.sum() if self.read_weight else 0.0
        return self.a(x) + extra, self.b(x)


def test_a_weight_read_elsewhere_stays_apart():
    x = torch.randn(3, 8)
    ep = _captured(TwoHeads(read_weight=False).eval(), x)
    assert concat_linears(ep) == ["2 linears over one input are one GEMM: a.weight, b.weight"]
    m = TwoHeads(read_weight=True).eval()
    ep = _captured(m, x)
    assert concat_linears(ep) == []
    ep.validate()


def test_outputs_meeting_in_an_elementwise_op_stay_apart():
    """``a(x) * b(x)`` is the b GEMM's epilogue when the two stay apart."""

    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return torch.relu(self.a(x)) * self.b(x)

    ep = _captured(Gated().eval(), torch.randn(3, 8))
    assert concat_linears(ep) == []


def test_braced_names():
    assert braced(["l.0.attn.q_proj.weight", "l.0.attn.k_proj.weight"]) == "l.0.attn.{q_proj,k_proj}.weight"
    assert braced(["q", "k"]) == "{q,k}"
    assert braced(["a.x.w", "a.y.z.w"]) == "a.{x,y.z}.w"


# --- end to end ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def block_package():
    torch.manual_seed(1)
    m = Block().eval()
    dump = WORK / "concat-linears-dump"
    pkg = export(m, (torch.randint(0, 50, (2, 5)),), {"ids": {0: ("batch", 1, 8), 1: ("seq", 1, 32)}},
                 targets=("cpu", "cuda:sm_90"), dump=dump, build_cubins=False)
    path = WORK / "concat-linears.tcpkg"
    pkg.save(path)
    return m, path, dump


def _assert_matches(got, eager, ids, atol, rtol):
    """The package's outputs against the eager block's at these ids."""
    with torch.no_grad():
        want = eager(torch.from_numpy(ids))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), atol=atol, rtol=rtol)


@pytest.mark.slow
@pytest.mark.parametrize("batch, seq", [(1, 1), (3, 17), (8, 32)])
def test_block_matches_eager_torch_free(block_package, batch, seq):
    eager, path, _ = block_package
    ids = np.random.default_rng(batch * seq).integers(0, 50, (batch, seq))
    _assert_matches(L.load(path)(ids), eager, ids, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_block_gpu_kernels_in_the_interpreter(block_package):
    from tcexport.exporter.check.interpret import run_interpreted

    eager, path, _ = block_package
    ids = np.random.default_rng(4).integers(0, 50, (2, 9))
    (got,) = run_interpreted(path, [[ids]])
    _assert_matches(got, eager, ids, atol=1e-4, rtol=1e-3)


@pytest.mark.slow
def test_package_holds_each_weight_once(block_package):
    _, path, dump = block_package
    weights = {w.name for w in L.load(path).manifest.weights}
    # a GPU target stores each private weight [K, N] (front/weights_kn.py); the head is tied to the embedding
    assert {"{q,k,v}.weight.T", "gate.weight.T", "up.weight.T", "head.weight", "o.weight.T", "down.weight.T"} <= weights
    assert not {"q.weight", "k.weight", "v.weight", "{q,k,v}.weight", "q.weight.T"} & weights
    assert "3 linears over one input are one GEMM: q.weight, k.weight, v.weight" in (dump / "graph.txt").read_text()


@pytest.mark.slow
def test_under_autocast_the_same_linears_join(tmp_path):
    """``--precision bf16`` captures the casts autocast makes; the gate and up outputs still meet in their
    product (through those casts), and the joined q/k/v package matches the autocast reference."""
    torch.manual_seed(2)
    pkg = export(Block().eval(), (torch.randint(0, 50, (2, 5)),), {"ids": {0: ("batch", 1, 8), 1: ("seq", 1, 32)}},
                 precision="bf16", dump=tmp_path / "dump")
    notes = [ln for ln in (tmp_path / "dump" / "graph.txt").read_text().splitlines() if "linears over" in ln]
    assert notes == ["3 linears over one input are one GEMM: q.weight, k.weight, v.weight"], notes
    ids = np.random.default_rng(3).integers(0, 50, (3, 11))
    got = L.load(pkg.save(tmp_path / "m.tcpkg"))(ids)
    with torch.no_grad():
        want = pkg.reference(torch.from_numpy(ids))
    for g, w in zip(got, want):  # bfloat16 outputs come as 16-bit words
        g = torch.from_numpy(np.ascontiguousarray(g).view(np.int16)).view(torch.bfloat16).float()
        np.testing.assert_allclose(g.numpy(), w.float().numpy(), atol=5e-2, rtol=5e-2)
