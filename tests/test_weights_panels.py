"""Linear weights stored as the CPU GEMM's 32-column panels at export (exporter/front/weights_panels.py), read in
place by tc_gemm_panels (cpu/codegen.py, runtime/prelude.h).

Checked on the captured program (torch runs the rewritten graph, so a wrong layout shows up as a wrong number), for
what must stay as it is (a weight tied to an embedding, one read elsewhere too, one too narrow, a 16-bit one behind
its cast), and end to end: every ISA bundle of a CPU package (the AVX-512 kernel and the portable one) against eager
at row counts that leave partial tiles and panels, with the generated C++ calling tc_gemm_panels once per packed
weight.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

import tcexport.loader as L
from tcexport.exporter import export
from tcexport.exporter.front.capture import decomposition_table
from tcexport.exporter.front.weights_panels import conv_pays, pack, weights_panels
from tcexport.formats.abi import CPU_ISA_REQUIRES
from tcexport.loader.native_cpu import cpu_flags


class Net(nn.Module):
    """Private linears of 200 (six panels, the last one 8 wide), 64 (two whole) and 50 columns, one stored [K, N] as
    transformers' Conv1D stores it (40 columns) and read by addmm as it is; one whose weight is also read outside its
    GEMM, one of 13 columns (too narrow), a head tied to an embedding, and a bfloat16 linear
    whose weight reaches its GEMM through a cast."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 48)
        self.a, self.b, self.c = nn.Linear(48, 200), nn.Linear(200, 64, bias=False), nn.Linear(40, 50)
        self.kn_weight, self.kn_bias = nn.Parameter(torch.randn(64, 40) / 8), nn.Parameter(torch.randn(40))
        self.d, self.e = nn.Linear(50, 48), nn.Linear(50, 13)
        self.low = nn.Linear(48, 32).to(torch.bfloat16)
        self.head = nn.Linear(48, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids, x):
        h = torch.addmm(self.kn_bias, self.b(torch.nn.functional.gelu(self.a(x))), self.kn_weight)
        h = torch.relu(self.c(h))
        g = self.d(h) + self.d.weight.sum() + self.embed(ids)
        return self.head(g), self.e(h), self.low(g.to(torch.bfloat16)).float()


def _inputs(batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 20, (batch,), generator=g), torch.randn(batch, 48, generator=g)


DYNAMIC = {"ids": {0: ("batch", 1, 512)}, "x": {0: ("batch", 1, 512)}}


def test_pack_lays_out_32_column_panels_zero_padded():
    w = torch.randn(70, 5)
    p = pack(w)
    assert p.shape == (3, 5, 32) and p.is_contiguous()
    for n in (0, 31, 32, 69):
        assert torch.equal(p[n // 32, :, n % 32], w[n])
    assert not p[2, :, 6:].any()  # columns 70..95 of the last panel


def test_private_float32_weights_become_panels_and_the_program_still_computes_the_model():
    torch.manual_seed(0)
    m, args = Net().eval(), _inputs(3)
    with torch.no_grad():
        ep = torch.export.export(m, args, strict=False).run_decompositions(decomposition_table())
        before = ep.module()(*args)
        notes = weights_panels(ep)
        ep.validate()
        after = ep.module()(*args)
    packed = sorted(k for k in ep.constants if k.endswith(".panels"))
    assert packed == ["a.weight.panels", "b.weight.panels", "c.weight.panels", "kn_weight.panels"], packed
    assert notes and notes[0].startswith("4 linear weights stored as 32-column panels")
    kept = set(ep.state_dict)
    assert {"d.weight", "e.weight", "low.weight", "embed.weight"} <= kept  # read elsewhere, narrow, cast, tied
    assert not {"a.weight", "b.weight", "c.weight", "kn_weight"} & kept
    for x, y in zip(before, after):
        torch.testing.assert_close(y, x, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def cpu_package(tmp_path_factory):
    torch.manual_seed(1)
    m = Net().eval()
    dump = tmp_path_factory.mktemp("weights-panels") / "dump"
    pkg = export(m, _inputs(2), DYNAMIC, dump=dump)
    return m, pkg.save(dump.parent / "net.tcpkg"), dump


def test_the_generated_cpp_reads_each_packed_weight_in_place(cpu_package):
    _, path, dump = cpu_package
    cpp = (dump / "model.cpp").read_text()
    calls = re.findall(r"tc_gemm_panels\(f\.nt, [^;]*?, (w_\w+), \w+\);", cpp)
    assert sorted(calls) == ["w_a_weight_panels", "w_b_weight_panels", "w_c_weight_panels", "w_kn_weight_panels"], \
        calls
    weights = {w.name for w in L.load(path).manifest.weights}
    assert {"a.weight.panels", "b.weight.panels", "c.weight.panels", "d.weight"} <= weights


def _bundles() -> list[str]:
    have = cpu_flags() or set()
    return [isa for isa, needs in CPU_ISA_REQUIRES.items() if set(needs) <= have]


@pytest.mark.parametrize("isa", _bundles())
@pytest.mark.parametrize("batch", [1, 7, 41, 300])
def test_every_bundle_matches_eager(cpu_package, isa, batch):
    """1 row (one tile row), 7 (a partial tile), 41 (tiles and a remainder, split over threads) and 300 (two row
    blocks of the AVX-512 kernel)."""
    m, path, _ = cpu_package
    ids, x = _inputs(batch, seed=batch)
    with torch.no_grad():
        want = [t.float().numpy() for t in m(ids, x)]
    got = L.load(path, isa=isa, num_threads=2)(ids.numpy(), x.numpy())
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, dtype=np.float32), w, rtol=2e-2 if w is want[2] else 1e-4,
                                   atol=2e-2 if w is want[2] else 1e-4)


def test_conv_pays_where_channels_fill_tiles_better_than_positions():
    assert conv_pays(49, 512, 4608) and conv_pays(196, 256, 2304)  # ResNet's last two stages
    assert conv_pays(3136, 64, 576) and conv_pays(784, 128, 1152)  # its first two: 9 times deeper than wide
    assert not conv_pays(3136, 64, 64) and not conv_pays(784, 256, 128)  # ResNet-50's 1x1 layers there
    assert not conv_pays(3136, 8, 72)  # deep enough, but 8 channels would fill a quarter of each tile
    assert not conv_pays(1, 1152, 48)  # a squeeze-excite's pooled map: one GEMM over the batch instead
    assert not conv_pays(49, 96, 16)  # too shallow for the transposed store to pay
    assert not conv_pays(196, 80, 480)  # 80 channels fill 3 panels no better than 196 positions fill 7 tiles


class Cnn(nn.Module):
    """Convolutions whose products run transposed: a 3x3 one over a 14x14 map read through its padded copy's
    row table (schedule/window_gemm.py), a strided 3x3 one read through im2col, a 1x1 one read in place, 200
    output channels (a last panel 8 wide); and one that stays (80 channels over 14x14)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, padding=1)
        self.window = nn.Conv2d(64, 96, 3, padding=1)
        self.down = nn.Conv2d(96, 200, 3, stride=2, padding=1)
        self.point = nn.Conv2d(200, 128, 1)
        self.stays = nn.Conv2d(64, 80, 1)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        y = torch.relu(self.down(torch.relu(self.window(h))))
        return self.point(y).mean((2, 3)), self.stays(h)


@pytest.fixture(scope="module")
def cnn_package(tmp_path_factory):
    torch.manual_seed(2)
    m = Cnn().eval()
    dump = tmp_path_factory.mktemp("conv-panels") / "dump"
    pkg = export(m, (torch.randn(2, 3, 14, 14),), {"x": {0: ("batch", 1, 16)}}, dump=dump)
    return m, pkg.save(dump.parent / "cnn.tcpkg"), dump


def test_the_convolutions_that_pay_run_transposed_on_their_panels(cnn_package):
    _, path, dump = cnn_package
    cpp = (dump / "model.cpp").read_text()
    calls = re.findall(r"tc_gemm_panels_t\(f\.nt, [^;]*?, (w_\w+), ", cpp)
    assert sorted(calls) == ["w_down_weight_panels", "w_point_weight_panels", "w_window_weight_panels"], calls
    assert re.search(r"tc_gemm_panels_t\([^;]*w_window_weight_panels[^;]*tc_brows\.data\(\)\);", cpp)
    weights = {w.name for w in L.load(path).manifest.weights}
    assert {"stem.weight", "stays.weight", "window.weight.panels"} <= weights


@pytest.mark.parametrize("isa", _bundles())
@pytest.mark.parametrize("batch", [1, 3])
def test_every_bundle_runs_the_convolutions_as_eager_does(cnn_package, isa, batch):
    m, path, _ = cnn_package
    x = torch.randn(batch, 3, 14, 14, generator=torch.Generator().manual_seed(batch))
    with torch.no_grad():
        want = [t.numpy() for t in m(x)]
    got = L.load(path, isa=isa, num_threads=2)(x.numpy())
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)


def test_only_the_panel_layout_is_read_as_panels():
    """cpu/codegen.is_panels proves the layout: a conv weight's view (through the reshape's divisions and
    remainders) passes; the same buffer read with a lane and its neighbour swapped, or off by one, does not."""
    from torch.utils._sympy.functions import FloorDiv, ModularIndexing

    from tcexport.exporter.cpu.codegen import is_panels
    from tcexport.exporter.ir import loops as ir

    cout, cin = 80, 64
    buf = ir.Buffer("w", "float32", (3, cin * 9, 32), "weight")
    co, k = ir.ivar(1), ir.ivar(2)
    ci, a, b = FloorDiv(k, 9), ModularIndexing(k, 3, 3), ModularIndexing(k, 1, 3)
    taps = 9 * ci + 3 * a + b  # the reshape [Cout, K] -> [Cout, Cin, 3, 3] composed with the GEMM's column split

    def reads(lane, depth):
        op = ir.GemmOperand("w", 0, 0, 0, 0, index=(FloorDiv(lane, 32), depth, ModularIndexing(lane, 1, 32)))
        return is_panels(buf, op, cout, cin * 9, co, k)

    assert reads(co, taps)
    assert not reads(co, 9 * ci + 3 * b + a)  # taps transposed
    assert not reads(co + 1, taps)
