"""Training torch-free from a --backward package: 20 SGD steps of a model whose forward returns its loss follow
PyTorch's loss curve, the weights saved as safetensors load back into the PyTorch module, and the weight API
(parameters, load_weights, save_weights) keeps every entry point reading the same arrays."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import tcexport.loader as L
from tcexport.formats import errors as E
from tcexport.formats.errors import TrainingError
from training_packages import LR, module, sgd_batches, torch_loss_curve, training_package

pytestmark = pytest.mark.slow


def _package_curve(m) -> list[float]:
    params = m.parameters()
    losses = []
    for x, labels in sgd_batches():
        loss, saved = m.forward(x, labels, grad=True)
        grads = m.backward(saved)  # the output is a scalar loss: its gradient is 1
        for name, p in params.items():
            p -= LR * grads[name]
        losses.append(float(loss))
    return losses


def test_sgd_follows_pytorch_and_weights_load_back(tmp_path):
    eager = module("classifier")
    want = torch_loss_curve(eager)
    m = L.load(training_package("classifier"))
    got = _package_curve(m)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert got[-1] < got[0] - 0.1  # it did learn
    path = m.save_weights(tmp_path / "tuned.safetensors")
    from safetensors.torch import load_file

    fresh = module("classifier")
    fresh.load_state_dict(load_file(path), strict=True)
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[key], value, rtol=1e-5, atol=1e-6)


def test_updates_reach_inference_and_stay_in_this_instance():
    m = L.load(training_package("classifier"))
    x, labels = next(sgd_batches())
    before = float(m(x, labels))
    m.parameters()["fc2.bias"][:] += np.array([5, -5, 5, -5], np.float32)
    after = float(m(x, labels))
    eager = module("classifier")
    with torch.no_grad():
        eager.fc2.bias += torch.tensor([5.0, -5.0, 5.0, -5.0])
        want = eager(torch.from_numpy(x), torch.from_numpy(labels)).item()
    assert after != before
    np.testing.assert_allclose(after, want, rtol=1e-5)
    fresh = L.load(training_package("classifier"))  # another load starts from the archive (copy-on-write)
    np.testing.assert_allclose(float(fresh(x, labels)), before, rtol=1e-6)


def test_load_weights_from_dict_and_file(tmp_path):
    eager = module("classifier")
    torch_loss_curve(eager)
    m = L.load(training_package("classifier"))
    m.load_weights({k: v for k, v in eager.state_dict().items()})
    x, labels = next(sgd_batches())
    want = eager(torch.from_numpy(x), torch.from_numpy(labels)).item()
    np.testing.assert_allclose(float(m(x, labels)), want, rtol=1e-5)
    path = m.save_weights(tmp_path / "w.safetensors", trainable_only=True)
    other = L.load(training_package("classifier"))
    other.load_weights(path)
    np.testing.assert_allclose(float(other(x, labels)), want, rtol=1e-5)


def test_load_weights_rejects_what_is_not_the_packages(tmp_path):
    m = L.load(training_package("classifier"))
    good = {k: v.copy() for k, v in m.parameters().items()}
    with pytest.raises(TrainingError, match="unknown names"):
        m.load_weights({**good, "fc3.weight": np.zeros(3, np.float32)})
    with pytest.raises(TrainingError, match="missing trainable weights"):
        m.load_weights({"fc1.weight": good["fc1.weight"]})
    with pytest.raises(TrainingError, match=r"float32\[4\], got float64\[4\]") as e:
        m.load_weights({**good, "fc2.bias": np.zeros(4, np.float64)})
    assert (e.value.name, e.value.expected, e.value.got) == ("fc2.bias", "float32[4]", "float64[4]")
    before = m.parameters()["fc1.weight"].copy()
    with pytest.raises(TrainingError):  # a bad entry leaves every weight as it was
        m.load_weights({**good, "fc1.weight": np.zeros_like(before), "fc2.bias": np.zeros(5, np.float32)})
    np.testing.assert_array_equal(m.parameters()["fc1.weight"], before)
    m.load_weights({"fc2.bias": np.zeros(4, np.float32), "unused": np.zeros(1)}, strict=False)
    assert not m.parameters()["fc2.bias"].any()
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 4)
    with pytest.raises(E.FormatError):
        m.load_weights(tmp_path / "bad.safetensors")


TORCH_FREE = r"""
import sys, json
sys.modules["torch"] = None  # the loader must train without torch: make `import torch` fail here
import numpy as np
import tcexport.loader as L
m = L.load(sys.argv[1])
rng = np.random.default_rng(0)
x, labels = rng.standard_normal((8, 16), dtype=np.float32), rng.integers(0, 4, 8).astype(np.int64)
losses = []
for _ in range(3):
    loss, saved = m.forward(x, labels, grad=True)
    for name, g in m.backward(saved).items():
        m.parameters()[name][...] -= 0.5 * g
    losses.append(float(loss))
m.save_weights(sys.argv[2])
print(json.dumps({"losses": losses, "torch": sys.modules["torch"] is not None,
                  "leaked": sorted(k for k in sys.modules if k.split(".")[0] in ("torch", "sympy", "triton"))}))
"""


def test_training_runs_without_torch(tmp_path):
    pkg = training_package("classifier")
    out = subprocess.run([sys.executable, "-c", TORCH_FREE, str(pkg), str(tmp_path / "w.safetensors")],
                         capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert report["torch"] is False and report["leaked"] == ["torch"]  # only the None placeholder
    eager = module("classifier")
    opt = torch.optim.SGD(eager.parameters(), lr=0.5)
    rng = np.random.default_rng(0)
    x, labels = rng.standard_normal((8, 16), dtype=np.float32), rng.integers(0, 4, 8).astype(np.int64)
    want = []
    for _ in range(3):
        opt.zero_grad()
        loss = eager(torch.from_numpy(x), torch.from_numpy(labels))
        loss.backward()
        opt.step()
        want.append(loss.item())
    np.testing.assert_allclose(report["losses"], want, rtol=1e-5)
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "w.safetensors")
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(saved[key], value, rtol=1e-5, atol=1e-6)
