"""Batch norm folded into the convolution before it, at export (exporter/front/fold_batchnorm.py).

The pass is checked on the captured program (torch runs the rewritten graph, so a wrong fold shows up as a
wrong number) and end to end: a CNN with conv1d / conv2d → batch norm → ReLU, with and without conv bias,
grouped, exported with a dynamic batch and run torch-free, with no batch norm left in the IR or the weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import tcexport.loader as L
from tcexport.exporter import export
from tcexport.exporter.front.capture import decomposition_table
from tcexport.exporter.front.fold_batchnorm import fold_batchnorm, folded_tensors
from packages import WORK

aten = torch.ops.aten
BN = aten._native_batch_norm_legit_no_training.default


def _trained(bn: nn.Module, seed: int) -> None:
    """Running statistics and affine parameters far from the defaults, as in a trained model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn.running_mean.copy_(torch.rand(bn.num_features, generator=g) - 0.5)
        bn.running_var.copy_(torch.rand(bn.num_features, generator=g) * 1.5 + 0.5)
        if bn.affine:
            bn.weight.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
            bn.bias.copy_(torch.rand(bn.num_features, generator=g) - 0.5)


class ConvBN(nn.Module):
    """conv → bn → relu for conv1d and conv2d; each with and without conv bias, one of each grouped."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 6, 3, groups=2)
        self.c2 = nn.Conv1d(6, 8, 3, padding=1, bias=False)
        self.c3 = nn.Conv2d(4, 8, 3, padding=1, groups=2, bias=False)
        self.c4 = nn.Conv2d(8, 6, 3, stride=2)
        self.bns = nn.ModuleList([nn.BatchNorm1d(6), nn.BatchNorm1d(8), nn.BatchNorm2d(8), nn.BatchNorm2d(6)])
        for k, bn in enumerate(self.bns):
            _trained(bn, k)

    def forward(self, x, y):
        a = torch.relu(self.bns[1](self.c2(torch.relu(self.bns[0](self.c1(x))))))
        b = torch.relu(self.bns[3](self.c4(torch.relu(self.bns[2](self.c3(y))))))
        return a, b


class SharedOutput(nn.Module):
    """The conv output is also read by the residual add, so the batch norm must stay a batch norm."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        _trained(self.bn, 7)

    def forward(self, x):
        c = self.conv(x)
        return torch.relu(self.bn(c)) + c


class StatsAsInputs(nn.Module):
    """The statistics are user inputs: folding them into a weight would freeze what the caller passes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3)

    def forward(self, x, mean, var):
        return nn.functional.batch_norm(self.conv(x), mean, var, training=False)


class SharedWeight(nn.Module):
    """One conv applied twice, each followed by its own batch norm (no affine): two folded weights."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 5, 1)
        self.bn_a, self.bn_b = nn.BatchNorm1d(5, affine=False), nn.BatchNorm1d(5, affine=False)
        _trained(self.bn_a, 1)
        _trained(self.bn_b, 2)

    def forward(self, x):
        return self.bn_a(self.conv(x)) + self.bn_b(self.conv(x))


def _captured(module: nn.Module, *args):
    with torch.no_grad():
        ep = torch.export.export(module.eval(), args, strict=False)
    return ep.run_decompositions(decomposition_table())


def _has_bn(ep) -> bool:
    return any(n.op == "call_function" and n.target == BN for n in ep.graph.nodes)


def _check_program_matches(ep, module, *args):
    """The rewritten program is still a valid ExportedProgram and computes what the module computes."""
    ep.validate()
    with torch.no_grad():
        got, want = ep.module()(*args), module(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_folds_every_conv_bn_pair():
    m = ConvBN().eval()
    args = (torch.randn(2, 4, 12), torch.randn(2, 4, 9, 9))
    ep = _captured(m, *args)
    notes = fold_batchnorm(ep)
    assert len(notes) == 4 and "bns.0.running_mean" in notes[0], notes
    assert not _has_bn(ep)
    keys = {s.target for s in ep.graph_signature.input_specs if s.target is not None}
    assert not any("running" in k or k.startswith("bns.") and "num_batches" not in k for k in keys), keys
    assert {f"c{i}.{p}.bn_folded" for i in range(1, 5) for p in ("weight", "bias")} <= keys
    assert not any("running" in k for k in list(ep.state_dict) + list(ep.constants))
    _check_program_matches(ep, m, *args)


def test_conv_output_with_another_user_is_not_folded():
    m, x = SharedOutput().eval(), torch.randn(1, 3, 6, 6)
    ep = _captured(m, x)
    assert fold_batchnorm(ep) == [] and _has_bn(ep)
    _check_program_matches(ep, m, x)


def test_statistics_from_user_inputs_are_not_folded():
    m = StatsAsInputs().eval()
    args = (torch.randn(2, 2, 7), torch.randn(4), torch.rand(4) + 0.5)
    ep = _captured(m, *args)
    assert fold_batchnorm(ep) == [] and _has_bn(ep)


def test_shared_conv_weight_folds_twice_under_distinct_names():
    m, x = SharedWeight().eval(), torch.randn(2, 3, 5)
    ep = _captured(m, x)
    assert len(fold_batchnorm(ep)) == 2 and not _has_bn(ep)
    assert {"conv.weight.bn_folded", "conv.weight.bn_folded_1"} <= set(ep.constants)
    assert "conv.weight" not in ep.state_dict  # nothing reads the original any more
    _check_program_matches(ep, m, x)


def test_folded_tensors_in_float64():
    """The formula itself, against batch norm applied to a conv by torch in float64."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(4, 1, 3, generator=g), torch.randn(4, generator=g)
    gamma, beta, mean = torch.randn(4, generator=g), torch.randn(4, generator=g), torch.randn(4, generator=g)
    var = torch.rand(4, generator=g) + 0.1
    x = torch.randn(2, 4, 9, generator=g, dtype=torch.float64)
    fw, fb = folded_tensors(w, b, gamma, beta, mean, var, 1e-3)
    assert fw.dtype == fb.dtype == torch.float32 and fw.shape == w.shape
    want = nn.functional.batch_norm(nn.functional.conv1d(x, w.double(), b.double(), groups=4), mean.double(),
                                    var.double(), gamma.double(), beta.double(), eps=1e-3)
    torch.testing.assert_close(nn.functional.conv1d(x, fw.double(), fb.double(), groups=4), want,
                               atol=1e-6, rtol=1e-6)


# --- end to end ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def conv_bn_package():
    m = ConvBN().eval()
    dump = WORK / "fold-bn-dump"
    pkg = export(m, (torch.randn(3, 4, 12), torch.randn(3, 4, 9, 9)),
                 {"x": {0: ("batch", 1, 32)}, "y": {0: "batch"}}, dump=dump)
    path = WORK / "fold-bn.tcpkg"
    pkg.save(path)
    return m, L.load(path), dump


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 5, 32])
def test_conv_bn_relu_matches_eager_torch_free(conv_bn_package, batch):
    eager, model, _ = conv_bn_package
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 4, 12), dtype=np.float32)
    y = rng.standard_normal((batch, 4, 9, 9), dtype=np.float32)
    got = model(x, y)
    with torch.no_grad():
        want = eager(torch.from_numpy(x), torch.from_numpy(y))
    assert len(got) == 2
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape)
        np.testing.assert_allclose(g, w.numpy(), atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_no_batch_norm_left_in_ir_or_weights(conv_bn_package):
    _, model, dump = conv_bn_package
    assert "batch_norm" not in (dump / "graph.txt").read_text()
    ir = (dump / "ir.txt").read_text()
    assert "rsqrt" not in ir and "running" not in ir  # the per-call scale (rsqrt of var + eps) is gone
    weights = {w.name for w in model.manifest.weights}
    assert not any("running" in w or w.startswith("bns.") for w in weights), weights
    assert weights == {f"c{i}.{p}.bn_folded" for i in range(1, 5) for p in ("weight", "bias")}


@pytest.mark.slow
def test_unfolded_batch_norm_still_exports(tmp_path):
    """The conv output with a second user keeps its batch norm (lowered pointwise) and still matches eager."""
    m = SharedOutput().eval()
    pkg = export(m, (torch.randn(2, 3, 6, 6),), {"x": {0: "batch"}}, dump=tmp_path)
    pkg.save(tmp_path / "m.tcpkg")
    model = L.load(tmp_path / "m.tcpkg")
    assert "rsqrt" in (tmp_path / "ir.txt").read_text()
    x = np.random.default_rng(0).standard_normal((3, 3, 6, 6), dtype=np.float32)
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(model(x), want, atol=1e-5, rtol=1e-4)
