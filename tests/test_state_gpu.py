"""Stateful packages on a real GPU: the state lives on the device, CUDA graphs replay per shape signature with the
state written in place, sessions stay apart, and an LM generates transformers' tokens. Skips where there is no
GPU (CI runs the same kernels in Triton's interpreter: test_state.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

from packages import EXAMPLES, MODELS, WORK, load_module  # noqa: E402
from tcexport.exporter.pipeline import export  # noqa: E402
from tcexport.loader import load  # noqa: E402

pytestmark = pytest.mark.gpu
ARCH = "sm_%d%d" % torch.cuda.get_device_capability()


def _kv_package():
    module = load_module(MODELS / "kv_cache.py")
    path = WORK / "kv_cache-gpu.tcpkg"
    if not path.exists():
        export(module.model(), module.example_inputs(), module.dynamic_shapes, f"cuda:{ARCH}",
               name="kv_cache").save(path)
    return path, module


def _steps(seed, n=6):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 3, 32, generator=g), torch.arange(3))] + \
        [(torch.randn(1, 1, 32, generator=g), torch.tensor([3 + i])) for i in range(n)]


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("inputs", ["numpy", "torch"])
def test_sessions_on_the_gpu_equal_eager(graphs, inputs):
    path, module = _kv_package()
    model = load(path, "cuda", graphs=graphs)
    a, b = model.new_session(), model.new_session()
    eager_a, eager_b = module.model(), module.model()
    for (xa, pa), (xb, pb) in zip(_steps(1), _steps(2)):
        for session, eager, x, p in ((a, eager_a, xa, pa), (b, eager_b, xb, pb)):
            with torch.no_grad():
                want = eager(x, p).numpy()
            if inputs == "torch":
                got = session(x.cuda(), p.cuda()).cpu().numpy()
            else:
                got = session(x.numpy(), p.numpy())
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for session, eager in ((a, eager_a), (b, eager_b)):
        state = session.state()
        for name in ("k_cache", "v_cache", "steps"):
            np.testing.assert_allclose(state[name], getattr(eager, name).numpy(), rtol=1e-4, atol=1e-5)
    a.reset_state()
    assert int(a.state()["steps"]) == 7 and not a.state()["k_cache"].any()


def test_a_bfloat16_cache_on_the_gpu_equals_eager():
    """A bf16 state lives on the device as the loader's own arrays, fed back to every call."""
    module = load_module(MODELS / "kv_cache.py")
    eager = module.model().to(torch.bfloat16)
    path = WORK / "kv_cache-bf16-gpu.tcpkg"
    x, pos = module.example_inputs()
    export(module.model().to(torch.bfloat16), (x.bfloat16(), pos), module.dynamic_shapes, f"cuda:{ARCH}",
           name="kv_cache_bf16").save(path)
    session = load(path, "cuda").new_session()
    for x, p in _steps(3):
        with torch.no_grad():
            want = eager(x.bfloat16(), p).float()
        got = session(x.bfloat16().cuda(), p.cuda()).float().cpu()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    cache = session.state()["k_cache"]
    assert cache.shape == tuple(eager.k_cache.shape)
    torch.testing.assert_close(torch.from_numpy(cache.view(np.int16)).view(torch.bfloat16).float(),
                               eager.k_cache.float(), rtol=2e-2, atol=2e-2)


def test_greedy_generation_on_the_gpu_equals_transformers():
    import os

    os.environ.update(TCEXPORT_LM="llama", TCEXPORT_LM_SIZE="small")
    file = load_module(EXAMPLES / "lm_cache.py")
    path = WORK / "lm-llama-gpu.tcpkg"
    spec_module = file.model()
    export(spec_module, file.example_inputs(), file.dynamic_shapes, f"cuda:{ARCH}", name="llama").save(path)
    generate = load_module(EXAMPLES / "generate.py").generate
    hf = file.hf_model()
    prompt = [5, 6, 7, 8]
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)[0, 4:].tolist()
    assert generate(load(path, "cuda"), prompt, 64) == want


def _methods_package():
    from tcexport.exporter.front.model_file import load_model_file

    path = WORK / "kv_methods-gpu.tcpkg"
    if not path.exists():
        spec = load_model_file(str(MODELS / "kv_methods.py"))
        export(spec.module, methods=spec.methods, targets=f"cuda:{ARCH}", name="kv_methods").save(path)
    return path, load_module(MODELS / "kv_methods.py")


@pytest.mark.parametrize("graphs", [True, False])
def test_methods_on_the_gpu_share_weights_and_state(graphs):
    """A package with methods (SPEC §2c) on the GPU: one weights upload read by both methods, prefill and decode
    interleaved on one session equal eager's sequence, a second session apart."""
    path, module = _methods_package()
    model, eager = load(path, device="cuda", graphs=graphs), module.model()
    prefill, decode = model.methods["prefill"], model.methods["decode"]
    assert decode.model.base._weight_ptrs == prefill.model.base._weight_ptrs  # one upload, read by both
    other = model.new_session()
    for k, (x, pos) in enumerate(_steps(5, 4)):
        name, fn = ("prefill", "forward") if k == 0 or k == 3 else ("decode", "step")
        with torch.no_grad():
            want = getattr(eager, fn)(x, pos).numpy()
        np.testing.assert_allclose(model.methods[name](x.numpy(), pos.numpy()), want, rtol=1e-4, atol=1e-4)
    state = model.state()
    for buf in ("k_cache", "v_cache", "steps"):
        np.testing.assert_allclose(state[buf], getattr(eager, buf).numpy(), rtol=1e-4, atol=1e-5)
    assert int(other.state()["steps"]) == 7
    model.close()


def test_lm_methods_on_the_gpu_generate_transformers_tokens():
    from tcexport.exporter.front.model_file import load_model_file

    spec = load_model_file(str(EXAMPLES / "lm_methods.py"))
    path = WORK / "lm-methods-gpu.tcpkg"
    export(spec.module, methods=spec.methods, targets=f"cuda:{ARCH}", name="lm").save(path)
    file = load_module(EXAMPLES / "lm_cache.py")
    prompt = [5, 6, 7, 8]
    with torch.no_grad():
        want = file.hf_model().generate(torch.tensor([prompt]), max_new_tokens=32,
                                        do_sample=False)[0, len(prompt):].tolist()
    generate = load_module(EXAMPLES / "generate.py").generate
    assert generate(load(path, device="cuda"), prompt, 32, methods=True) == want
