"""Training from a CUDA package on a real GPU (``--backward --target cuda:sm_XX``): gradients against float64
autograd, 20 SGD steps through ``parameters()`` that follow PyTorch's loss curve, the tuned weights loading back
into the PyTorch module, and the array kinds, guards and typed errors of training calls. Skips cleanly where there
is no GPU (CI); tests/test_cuda_training.py checks the same kernels in Triton's interpreter there.

    python -m pytest tests/test_cuda_gpu_training.py -x -q

``TCEXPORT_PREBUILT=DIR`` takes the packages from DIR, built on any machine (no GPU needed) by
``python tests/training_packages.py DIR cuda:sm_90``: building them on the GPU machine takes most of a short slot.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import tcexport.loader as L  # noqa: E402
from tcexport.formats import errors as E  # noqa: E402
from tcexport.loader.cuda_training import CudaSaved, TrainableCudaModel  # noqa: E402
from training_packages import (LR, assert_gradients_close, module, random_inputs, reference_gradients,  # noqa: E402
                               sgd_batches, torch_loss_curve, training_package)

pytestmark = pytest.mark.gpu

TARGET = "cuda:sm_%d%d" % torch.cuda.get_device_capability()


def package(name: str, *grad_inputs: str):
    return training_package(name, *grad_inputs, targets=TARGET)


CASES = [("mlp", (1, 64)), ("mlp", (7, 64)), ("mlp", (1024, 64)),
         ("cnn", (1, 3, 32, 32)), ("cnn", (5, 3, 32, 32)),
         ("decoder", (1, 1)), ("decoder", (3, 17)), ("decoder", (16, 128))]


@pytest.mark.parametrize("name, shape", CASES)
def test_gradients_match_float64_autograd(name, shape):
    grad_inputs = ("x",) if name == "mlp" else ()
    m = L.load(package(name, *grad_inputs), device="cuda")
    assert isinstance(m, TrainableCudaModel)
    xs = random_inputs(name, shape, seed=sum(shape))
    out, saved = m.forward(*[torch.from_numpy(x).cuda() for x in xs], grad=True)
    assert out.is_cuda and out.dtype == torch.float32 and isinstance(saved, CudaSaved) and saved.nbytes > 0
    g = np.random.default_rng(len(shape)).standard_normal(tuple(out.shape), dtype=np.float32)
    grads = m.backward(saved, torch.from_numpy(g).cuda())
    assert all(v.is_cuda and v.dtype == torch.float32 for v in grads.values())
    ref_out, ref_grads = reference_gradients(name, xs, [g], grad_inputs)
    np.testing.assert_allclose(out.cpu().numpy(), ref_out[0], rtol=2e-4, atol=2e-5)
    assert_gradients_close({k: v.cpu().numpy() for k, v in grads.items()}, ref_grads)
    # inference on the same model is the inference launch list (CUDA graphs), unchanged by training calls
    np.testing.assert_allclose(m(*[torch.from_numpy(x).cuda() for x in xs]).cpu().numpy(), ref_out[0],
                               rtol=2e-4, atol=2e-5)


def test_sgd_follows_pytorch_and_weights_load_back(tmp_path):
    eager = module("classifier")
    want = torch_loss_curve(eager)
    m = L.load(package("classifier"), device="cuda")
    params = m.parameters()
    assert all(p.is_cuda for p in params.values())
    got = []
    for x, labels in sgd_batches():
        loss, saved = m.forward(torch.from_numpy(x).cuda(), torch.from_numpy(labels).cuda(), grad=True)
        grads = m.backward(saved)  # a scalar loss: its gradient is 1
        with torch.no_grad():
            for name, p in params.items():
                p -= LR * grads[name]  # in place: the model's own device weights
        got.append(float(loss))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert got[-1] < got[0] - 0.1  # it did learn
    from safetensors.torch import load_file

    fresh = module("classifier")
    fresh.load_state_dict(load_file(m.save_weights(tmp_path / "tuned.safetensors")), strict=True)
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[key], value, rtol=1e-4, atol=1e-5)


def test_updates_reach_inference_and_load_weights_replaces_them():
    m = L.load(package("classifier"), device="cuda")
    x, labels = next(sgd_batches())
    xs = (torch.from_numpy(x).cuda(), torch.from_numpy(labels).cuda())
    before = float(m(*xs))  # captures a CUDA graph that reads the weights by address
    m.parameters()["fc2.bias"].add_(torch.tensor([5.0, -5.0, 5.0, -5.0], device="cuda"))
    eager = module("classifier")
    with torch.no_grad():
        eager.fc2.bias.add_(torch.tensor([5.0, -5.0, 5.0, -5.0]))
        want = float(eager(torch.from_numpy(x), torch.from_numpy(labels)))
    assert abs(float(m(*xs)) - before) > 1e-3
    assert float(m(*xs)) == pytest.approx(want, rel=1e-4)
    m.load_weights({k: v.cuda() for k, v in module("classifier").state_dict().items()})  # device tensors
    assert float(m(*xs)) == pytest.approx(before, rel=1e-6)
    m.load_weights(eager.state_dict())  # host tensors
    assert float(m(*xs)) == pytest.approx(want, rel=1e-4)
    assert float(L.load(package("classifier"), device="cuda")(*xs)) == pytest.approx(before, rel=1e-6)


def test_load_weights_rejects_what_is_not_the_packages():
    m = L.load(package("classifier"), device="cuda")
    state = {k: v.cuda() for k, v in module("classifier").state_dict().items()}
    with pytest.raises(E.TrainingError, match="unknown names"):
        m.load_weights({**state, "extra": torch.zeros(1, device="cuda")})
    with pytest.raises(E.TrainingError, match="missing trainable weights"):
        m.load_weights({k: v for k, v in state.items() if k != "fc1.bias"})
    with pytest.raises(E.TrainingError, match=r"float32\[4\], got float64\[4\]") as e:
        m.load_weights({**state, "fc2.bias": state["fc2.bias"].double()})
    assert e.value.name == "fc2.bias"
    m.load_weights({"fc2.bias": torch.ones(4, device="cuda"), "extra": 1}, strict=False)
    assert torch.equal(m.parameters()["fc2.bias"], torch.ones(4, device="cuda"))


def test_numpy_in_numpy_out_and_cupy():
    m = L.load(package("mlp", "x"), device="cuda")
    x = np.random.default_rng(5).standard_normal((4, 64), dtype=np.float32)
    out, saved = m.forward(x, grad=True)
    g = np.ones(out.shape, np.float32)
    grads = m.backward(saved, g)
    assert isinstance(out, np.ndarray) and all(isinstance(v, np.ndarray) for v in grads.values())
    assert_gradients_close(grads, reference_gradients("mlp", [x], [g], ("x",))[1])
    cupy = pytest.importorskip("cupy")
    out, saved = m.forward(cupy.asarray(x), grad=True)
    grads = m.backward(saved, cupy.asarray(g))
    assert isinstance(out, cupy.ndarray) and all(isinstance(v, cupy.ndarray) for v in grads.values())
    assert_gradients_close({k: cupy.asnumpy(v) for k, v in grads.items()},
                           reference_gradients("mlp", [x], [g], ("x",))[1])


def test_saved_is_reusable_and_guards_hold():
    m = L.load(package("mlp", "x"), device="cuda")
    x = torch.randn(3, 64, device="cuda")
    out, saved = m.forward(x, grad=True)
    g = torch.randn_like(out)
    a, b = m.backward(saved, g), m.backward(saved, g)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(E.DtypeError):
        m.backward(saved, g.double())
    with pytest.raises(E.SymbolConflictError):
        m.backward(saved, torch.randn(4, out.shape[1], device="cuda"))
    with pytest.raises(E.ArityError):
        m.backward(saved)  # the output is not a scalar: its gradient must be given
    with pytest.raises(E.DtypeError):
        m.forward(x.double(), grad=True)
    other = L.load(package("mlp", "x"), device="cuda")
    with pytest.raises(E.TrainingError):
        other.backward(saved, g)


def test_out_of_range_index_in_the_training_forward():
    m = L.load(package("decoder"), device="cuda")
    with pytest.raises(E.RuntimeKernelError, match="out of range"):
        m.forward(torch.tensor([[1, 2, 10**6]], device="cuda"), grad=True)
    out, saved = m.forward(torch.tensor([[1, 2, 3]], device="cuda"), grad=True)  # the error word was reset
    assert out.shape[:2] == (1, 3)
