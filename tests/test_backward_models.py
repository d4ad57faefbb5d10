"""Backward packages of the example models: gradients against torch.autograd in float64 at several shapes
(dynamic batch, and sequence for the decoder), the training forward against inference, and the guards."""

from __future__ import annotations

import numpy as np
import pytest

import tcexport.loader as L
from tcexport.formats import errors as E
from tcexport.formats.errors import TrainingError
from tcexport.loader.training import Saved, TrainableModel
from packages import built, mlp_package
from training_packages import MODEL_FILES, assert_gradients_close, random_inputs, reference_gradients, training_package

pytestmark = pytest.mark.slow


CASES = [("mlp", (1, 64)), ("mlp", (7, 64)), ("mlp", (1024, 64)),
         ("cnn", (1, 3, 32, 32)), ("cnn", (5, 3, 32, 32)),
         ("decoder", (1, 1)), ("decoder", (2, 12)), ("decoder", (3, 17)),
         pytest.param("decoder", (16, 128), marks=pytest.mark.long)]  # the range's top: -m long


@pytest.mark.parametrize("name, shape", CASES)
def test_gradients_match_float64_autograd(name, shape):
    grad_inputs = ("x",) if name == "mlp" else ()
    m = L.load(training_package(name, *grad_inputs))
    inputs = random_inputs(name, shape, seed=sum(shape))
    out, saved = m.forward(*inputs, grad=True)
    g = np.random.default_rng(len(shape)).standard_normal(out.shape, dtype=np.float32)
    grads = m.backward(saved, g)
    ref_out, ref_grads = reference_gradients(name, inputs, [g], grad_inputs)
    np.testing.assert_allclose(out, ref_out[0], rtol=1e-4, atol=1e-5)
    assert_gradients_close(grads, ref_grads)
    assert all(grads[k].dtype == np.float32 for k in grads)


@pytest.mark.parametrize("name", ["mlp", "decoder"])
def test_inference_graph_is_the_inference_only_one(name):
    """A --backward package's tc_run is the inference package's graph where export rewrites no weights (the MLP):
    same kernels, same outputs. The decoder's inference package joins its q/k/v linears into one GEMM
    (front/concat_linears.py), which a training package, sharing its weights with its training graphs,
    never does: fewer GEMMs, the same outputs up to rounding. The inference-only package has no training section
    and no training entry points."""
    inference = L.load(built(str(MODEL_FILES[name])))
    training = L.load(training_package(name))
    assert isinstance(training, TrainableModel) and not isinstance(inference, TrainableModel)
    assert inference.manifest.training is None
    x = random_inputs(name, (3, 64) if name == "mlp" else (3, 9), seed=5)
    if name == "mlp":
        assert training.manifest.plan["kernels"] == inference.manifest.plan["kernels"]
        assert training.manifest.workspace_bytes == inference.manifest.workspace_bytes
        np.testing.assert_array_equal(training(*x), inference(*x))
    else:
        def gemms(m):
            return sum("gemm" in k for k in m.manifest.plan["kernels"])
        assert gemms(inference) == gemms(training) - 2 * 2  # two layers: q, k, v -> 1
        np.testing.assert_allclose(training(*x), inference(*x), rtol=1e-5, atol=1e-6)
    out, _ = training.forward(*x, grad=True)
    np.testing.assert_allclose(out, inference(*x), rtol=1e-5, atol=1e-6)


def test_inference_only_library_has_no_training_entries():
    m = L.load(mlp_package())
    with pytest.raises(AttributeError):
        m._native.cdll.tc_run_backward


def test_manifest_training_section():
    m = L.load(training_package("mlp", "x"))
    t = m.manifest.training
    assert t.forward.entry == "tc_run_train_forward" and t.backward.entry == "tc_run_backward"
    assert list(t.trainable) == ["fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight", "fc2.bias"]
    assert [of for of in t.gradients] == [("weight", n) for n in t.trainable] + [("input", "x")]
    # weights and the input are read in place, never saved; the softmax output is passed back, not copied
    saved = t.forward.outputs[len(m.manifest.outputs):]
    assert all(s.shape[0] == "batch" for s in saved) and len(saved) <= 4
    kinds = [kind for kind, _ in t.sources]
    assert kinds.count("input") == 1 and kinds.count("grad") == 1 and ("forward", 0) in t.sources


def test_backward_guards():
    m = L.load(training_package("mlp"))
    x = np.zeros((4, 64), np.float32)
    with pytest.raises(E.SymbolRangeError):
        m.forward(np.zeros((0, 64), np.float32), grad=True)
    _, saved = m.forward(x, grad=True)
    with pytest.raises(E.DtypeError):
        m.backward(saved, np.zeros((4, 32), np.float64))
    with pytest.raises(E.SymbolConflictError) as info:
        m.backward(saved, np.zeros((5, 32), np.float32))
    assert info.value.dim == 0 and info.value.expected == 4 and info.value.got == 5
    with pytest.raises(E.RankError):
        m.backward(saved, np.zeros((4, 32, 1), np.float32))
    with pytest.raises(E.ArityError):
        m.backward(saved)  # a [4, 32] output is not a loss: its gradient must be passed
    with pytest.raises(E.ArityError):
        m.backward(saved, np.zeros((4, 32), np.float32), np.zeros((4, 32), np.float32))
    other = L.load(training_package("mlp"))
    with pytest.raises(TrainingError):
        other.backward(saved, np.zeros((4, 32), np.float32))


def test_saved_is_reusable_and_per_call():
    m = L.load(training_package("mlp"))
    x1 = np.random.default_rng(1).standard_normal((3, 64), dtype=np.float32)
    x2 = np.random.default_rng(2).standard_normal((6, 64), dtype=np.float32)
    g1, g2 = np.ones((3, 32), np.float32), np.ones((6, 32), np.float32)
    _, s1 = m.forward(x1, grad=True)
    _, s2 = m.forward(x2, grad=True)
    assert isinstance(s1, Saved) and s1.signature.env == {"batch": 3} and s2.nbytes == 2 * s1.nbytes
    first = m.backward(s1, g1)
    m.backward(s2, g2)
    again = m.backward(s1, g1)
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    m = L.load(training_package("mlp"))
    x = torch.randn(4, 64)
    out, saved = m.forward(x, grad=True)
    grads = m.backward(saved, torch.ones(4, 32))
    assert isinstance(out, torch.Tensor) and all(isinstance(g, torch.Tensor) for g in grads.values())
    ref = m.backward(m.forward(x.numpy(), grad=True)[1], np.ones((4, 32), np.float32))
    for k in ref:
        np.testing.assert_array_equal(grads[k].numpy(), ref[k])


def test_derived_dims_and_two_outputs():
    """Inputs tied by derived dims (2*seq, seq-1) and a model with two outputs: every input's gradient and the
    parameter's, at several (batch, seq); the training forward checks the same guards as inference."""
    m = L.load(training_package("dyn_derived", "x", "pairs", "prev"))
    for batch, seq in ((1, 2), (3, 7), (2, 64)):
        rng = np.random.default_rng(seq)
        inputs = [rng.standard_normal((batch, n, 8), dtype=np.float32) for n in (seq, 2 * seq, seq - 1)]
        outs, saved = m.forward(*inputs, grad=True)
        gs = [rng.standard_normal(o.shape, dtype=np.float32) for o in outs]
        grads = m.backward(saved, *gs)
        ref_outs, ref = reference_gradients("dyn_derived", inputs, gs, ("x", "pairs", "prev"))
        for o, r in zip(outs, ref_outs):
            np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-6)
        assert_gradients_close(grads, ref)
    with pytest.raises(E.SymbolConflictError):
        m.forward(np.zeros((1, 4, 8), np.float32), np.zeros((1, 7, 8), np.float32), np.zeros((1, 3, 8), np.float32),
                  grad=True)


def test_divisibility_guard_holds_for_training():
    m = L.load(training_package("dyn_divisible", "x"))
    x = np.random.default_rng(0).standard_normal((2, 12, 16), dtype=np.float32)
    out, saved = m.forward(x, grad=True)
    g = np.ones(out.shape, np.float32)
    _, ref = reference_gradients("dyn_divisible", [x], [g], ("x",))
    assert_gradients_close(m.backward(saved, g), ref)
    with pytest.raises(E.RelationError):
        m.forward(np.zeros((2, 10, 16), np.float32), grad=True)
