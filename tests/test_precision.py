"""``--precision bf16|fp16``: float32 models exported with torch.autocast("cuda")'s semantics (front/autocast.py).

The package is compared with the autocast module it was built from (``package.reference``); that module is
checked against torch.autocast itself where the CPU's and the GPU's policies agree (linear, relu), and against
torch.autocast("cuda") on a GPU (skipped elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import tcexport.loader as L
from tcexport.exporter import export
from tcexport.exporter.errors import ExportError
from tcexport.exporter.front import autocast
from tcexport.exporter.front.model_file import load_model_file
from packages import WORK

pytestmark = pytest.mark.slow
aten = torch.ops.aten


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Block(nn.Module):
    """A pre-norm transformer block: every policy class (GEMMs, layer norm, softmax, exp) in one graph."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


def _seeded(module):
    torch.manual_seed(0)
    return module().eval()


def _run(pkg, name, *inputs):
    out = WORK / f"precision-{name}.tcpkg"
    pkg.save(out)
    got = L.load(out)(*inputs)
    return got if isinstance(got, tuple) else (got,)


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def test_policy_classes():
    assert autocast.policy(aten.linear.default) == "lower"
    assert autocast.policy(aten.conv2d.default) == "lower"
    assert autocast.policy(aten.scaled_dot_product_attention.default) == "lower"
    assert autocast.policy(aten.layer_norm.default) == "float32"
    assert autocast.policy(aten.softmax.int) == "float32"
    assert autocast.policy(aten.sum.dim_IntList) == "float32"
    assert autocast.policy(aten.cat.default) == "promote"
    assert autocast.policy(aten.relu.default) is None
    assert autocast.policy(torch.relu) is None  # not an ATen overload


def test_unknown_precision_and_backward_are_errors():
    x = torch.randn(2, 32)
    with pytest.raises(ExportError, match="bf16, fp16"):
        export(_seeded(MLP), (x,), precision="int4")
    with pytest.raises(ExportError, match="--backward"):
        export(_seeded(MLP), (x,), precision="bf16", backward=True)


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mlp_matches_torch_autocast_and_stores_16_bit_weights(precision, dtype):
    model = _seeded(MLP)
    pkg = export(model, (torch.randn(2, 32),), {"x": {0: "batch"}}, precision=precision)
    assert {w.dtype for w in pkg.manifest.weights} == {str(dtype).removeprefix("torch.")}
    assert pkg.manifest.outputs[0].dtype == str(dtype).removeprefix("torch.")  # autocast's output dtype
    assert model.fc1.weight.dtype == torch.float32  # the user's module is untouched
    x = torch.randn(5, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):  # CPU and CUDA policies agree on linear and relu
        want = model(x)
    ref = pkg.reference(x)
    assert ref.dtype == dtype
    torch.testing.assert_close(ref.float(), want.float(), rtol=0, atol=0)
    (got,) = _run(pkg, f"mlp-{precision}", x)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)


def test_block_runs_norms_and_softmax_in_float32():
    model = _seeded(Block)
    pkg = export(model, (torch.randn(2, 8, 32),), {"x": {0: "batch", 1: ("seq", 1, 64)}}, precision="bf16")
    code = pkg.reference.code
    assert "softmax.int(_to_copy" in code  # the bf16 scores are widened before the softmax
    for shape in [(1, 1, 32), (3, 17, 32)]:
        x = torch.randn(shape)
        with torch.no_grad():
            want = pkg.reference(x)
        (got,) = _run(pkg, "block", x)
        assert got.dtype == want.dtype == torch.float32  # the residual stream stays float32, as under autocast
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_cnn_with_folded_batch_norm():
    from packages import EXAMPLES

    spec = load_model_file(EXAMPLES / "cnn.py")
    pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, precision="bf16")
    assert any(w.dtype == "bfloat16" for w in pkg.manifest.weights)
    x = torch.randn(3, *spec.example_inputs[0].shape[1:])
    with torch.no_grad():
        want = _as_tuple(pkg.reference(x))
    got = _run(pkg, "cnn", x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), rtol=5e-2, atol=5e-2)


def test_gpt2_with_dynamic_batch_and_seq():
    pytest.importorskip("transformers")
    from packages import MODELS

    spec = load_model_file(MODELS / "hf_gpt2.py")
    pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, precision="bf16")
    weights = {w.name: w.dtype for w in pkg.manifest.weights}
    tied = [n for n in weights if n.endswith(("wte.weight", "lm_head.weight"))]  # one tensor, either name
    assert tied and all(weights[n] == "float32" for n in tied)  # read by the embedding too: stays float32
    assert any(d == "bfloat16" for n, d in weights.items() if n.endswith("c_attn.weight"))
    for shape in [(1, 1), (3, 17)]:
        ids = torch.randint(0, 256, shape)
        with torch.no_grad():
            want = pkg.reference(ids)
        (got,) = _run(pkg, "gpt2", ids)
        torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)


def test_cuda_kernels_in_the_interpreter():
    pytest.importorskip("triton")
    from tcexport.exporter.check.interpret import run_interpreted

    model = _seeded(Block)
    pkg = export(model, (torch.randn(2, 8, 32),), {"x": {0: "batch"}}, "cuda:sm_90", precision="bf16",
                 build_cubins=False, cache_dir=WORK / "cache")
    out = WORK / "precision-block-cuda.tcpkg"
    pkg.save(out)
    x = torch.randn(3, 8, 32)
    (got,), = run_interpreted(out, [[x.numpy()]])
    with torch.no_grad():
        want = pkg.reference(x)
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)), want, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_reference_equals_torch_autocast_on_the_gpu():
    """The policy written in autocast.py is torch.autocast("cuda")'s: the cast module and the model under
    autocast compute the same values on the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = _seeded(Block)
    pkg = export(model, (torch.randn(2, 8, 32),), {"x": {0: "batch"}}, precision="bf16")
    x = torch.randn(4, 8, 32, device="cuda")
    with torch.no_grad():
        got = pkg.reference.cuda()(x)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            want = model.cuda()(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)
