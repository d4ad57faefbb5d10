"""examples/cnn.py end to end: conv / batch norm / pooling export with a dynamic batch, run torch-free."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tcexport.loader as L
from packages import EXAMPLES, built, load_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def eager():
    return load_module(EXAMPLES / "cnn.py").model().eval()


@pytest.fixture(scope="module")
def model():
    return L.load(built(str(EXAMPLES / "cnn.py")))


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_matches_eager(model, eager, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32), dtype=np.float32)
    got = model(x)
    with torch.no_grad():
        want = eager(torch.from_numpy(x)).numpy()
    assert got.shape == (batch, 10) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def test_signature(model):
    (x,), (out,) = model.inputs, model.outputs
    assert list(x.shape) == ["batch", 3, 32, 32] and list(out.shape) == ["batch", 10]
    assert [(s.name, s.min, s.max) for s in model.manifest.symbols] == [("batch", 1, 64)]


def test_batch_norm_folds_and_relu_fuses_away(model):
    """Batch norm is folded into each conv's weight and bias at export; bias and ReLU leave no kernel of their own
    over the activations: they run in the epilogue of the convolution's GEMM. Each convolution is a padded copy
    of its input (the only pointwise kernels; schedule/window_gemm.py), a GEMM reading its taps there, and the
    epilogue that writes the output from the GEMM's wider rows."""
    names = model.manifest.plan["kernels"]
    kinds = [n.split("_", 1)[1] for n in names]
    # padded copy, conv GEMM, bias + ReLU, max pool (its taps written out: lower/conv.py); again, avg pool; linear
    conv = ["pointwise_phases", "gemm", "gemm_epilogue"]
    assert kinds == conv + ["pointwise"] + conv + ["reduce_sum", "gemm_epilogue"], names
    weights = {w.name for w in model.manifest.weights}
    # conv2, deeper than it has channels, runs transposed on its packed weight (front/weights_panels.py)
    assert weights == {"conv1.weight.bn_folded", "conv1.bias.bn_folded", "conv2.weight.bn_folded.panels",
                       "conv2.bias.bn_folded", "head.weight", "head.bias"}, weights


@pytest.mark.parametrize("pool", [torch.nn.AvgPool2d(1280, ceil_mode=True),
                                  torch.nn.AvgPool2d(9, stride=2, padding=2, ceil_mode=True, count_include_pad=False),
                                  torch.nn.MaxPool2d(9, ceil_mode=True, return_indices=True)],
                         ids=["global-as-avgpool1280", "avg-past-input", "max-past-input-indices"])
def test_pool_window_larger_than_input(pool, tmp_path):
    """EfficientNet pools 7x7 with AvgPool2d(1280, ceil_mode=True): the reduction visits only what can be read
    (a 1280x1280 window per output took 70% of a 4.6 s call before)."""
    from tcexport.exporter import export

    x = torch.randn(2, 3, 7, 7)
    path = tmp_path / "pool.tcpkg"
    export(pool, (x,), dynamic_shapes={"input": {0: ("batch", 1, 8)}}, cache_dir=tmp_path / "cache").save(path)
    got, want = L.load(path)(x.numpy()), pool(x)
    for g, w in zip(got if isinstance(want, tuple) else [got], want if isinstance(want, tuple) else [want]):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-6, atol=1e-6)
