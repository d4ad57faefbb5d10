"""The lowering rules only backward graphs use (exporter/lower/grad.py), each through a small module exported with
--backward and a dynamic batch: gradients of the parameters and of the input against float64 autograd."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import tcexport.loader as L
from packages import WORK
from training_packages import assert_gradients_close

pytestmark = pytest.mark.slow


class Conv(nn.Module):
    def __init__(self, dims: int, **kw):
        super().__init__()
        self.conv = (nn.Conv1d if dims == 1 else nn.Conv2d)(4, 6, 3, **kw)

    def forward(self, x):
        return torch.tanh(self.conv(x))


class Pool(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 4).view(1, 4, 1, 1))
        self.kw = kw

    def forward(self, x):
        return nn.functional.max_pool2d(x * self.scale, **self.kw)


class Embed(nn.Module):
    """An embedding read at repeated ids (the backward accumulates their rows), then a linear layer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 5)
        self.out = nn.Linear(5, 3)

    def forward(self, ids, x):
        return self.out(self.embed(ids) * x)


class Loss(nn.Module):
    """cross-entropy (nll_loss's backward scatters into the logits' gradient)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x, labels):
        return nn.functional.cross_entropy(self.fc(x), labels)


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


CASES = {
    "conv2d stride 2 padding 1": (lambda: Conv(2, stride=2, padding=1), lambda b: (_x(b, 4, 9, 8),)),
    "conv2d dilation 2": (lambda: Conv(2, dilation=2, padding=2), lambda b: (_x(b, 4, 7, 7),)),
    "conv2d groups 2 no bias": (lambda: Conv(2, groups=2, bias=False, stride=(1, 2)), lambda b: (_x(b, 4, 6, 7),)),
    "conv1d stride 3": (lambda: Conv(1, stride=3, padding=2), lambda b: (_x(b, 4, 11),)),
    "max_pool overlapping": (lambda: Pool(kernel_size=3, stride=2, padding=1), lambda b: (_x(b, 4, 9, 8),)),
    "max_pool dilation": (lambda: Pool(kernel_size=2, stride=1, dilation=2), lambda b: (_x(b, 4, 6, 6),)),
    "max_pool tiling, odd size": (lambda: Pool(kernel_size=2), lambda b: (_x(b, 4, 7, 6),)),
    "embedding": (Embed, lambda b: (torch.tensor([[1, 9, 3, 1], [9, 0, 0, 7], [2, 2, 2, 2]])[:b].clone(), _x(b, 4, 5))),
    "cross entropy": (Loss, lambda b: (_x(b, 6), torch.arange(b) % 5)),
}


def _package(case: str, module: nn.Module, inputs: tuple):
    from tcexport.exporter.pipeline import export

    dynamic = {name: {0: ("batch", 1, 16)} for name in ("x", "ids", "labels")
               if name in module.forward.__code__.co_varnames[:module.forward.__code__.co_argcount]}
    grad_inputs = ["x"] if "x" in dynamic else []
    path = WORK / f"backward-op-{case.replace(' ', '-')}.tcpkg"
    export(module, inputs, dynamic, name="op", backward=True, grad_inputs=grad_inputs).save(path)
    return L.load(path), grad_inputs


@pytest.mark.parametrize("case", list(CASES))
def test_backward_rule_matches_autograd(case):
    build, make_inputs = CASES[case]
    torch.manual_seed(0)
    module = build().eval()
    m, grad_inputs = _package(case, module, make_inputs(2))
    for batch in (1, 3):
        inputs = make_inputs(batch)
        arrays = [t.numpy() for t in inputs]
        out, saved = m.forward(*arrays, grad=True)
        g = None if out.ndim == 0 else np.random.default_rng(batch).standard_normal(out.shape, dtype=np.float32)
        grads = m.backward(saved) if g is None else m.backward(saved, g)
        ref = copy.deepcopy(module).double()
        tensors = [t.double().requires_grad_("x" in grad_inputs and t.is_floating_point()) if t.is_floating_point()
                   else t for t in inputs]
        y = ref(*tensors)
        y.backward() if g is None else y.backward(torch.from_numpy(g).double())
        want = {k: p.grad.numpy() for k, p in ref.named_parameters()}
        want.update({"x": t.grad.numpy() for t in tensors if t.is_floating_point() and "x" in grad_inputs})
        np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-4, atol=1e-5)
        assert_gradients_close(grads, want)
