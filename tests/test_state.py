"""Stateful packages (SPEC §2b): buffers the forward writes become state the loader keeps; each session's calls
equal eager PyTorch's on its own module, a failed call leaves the state as it was, and an LM with a static KV cache
generates torch-free exactly the tokens transformers' ``generate`` does."""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import numpy as np
import pytest
import torch

from packages import EXAMPLES, MODELS, WORK, built, load_module
from tcexport.formats.errors import ArityError, FormatError, RuntimeKernelError
from tcexport.formats.manifest import parse_manifest
from tcexport.loader import load
from tcexport.loader.archive import open_archive

KV = str(MODELS / "kv_cache.py")


def _steps(seed: int, n: int = 5):
    """A prompt of 3 positions, then ``n`` single-position steps (decode)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 3, 32, generator=g), torch.arange(3))] + \
        [(torch.randn(1, 1, 32, generator=g), torch.tensor([3 + i])) for i in range(n)]


def _eager(module, x, pos):
    with torch.no_grad():
        return module(x, pos).numpy()


def test_state_in_the_manifest():
    m = open_archive(built(KV)).manifest
    assert m.format_version == (1, 9)
    assert [(s.name, s.initial, s.in_place) for s in m.state] == [
        ("k_cache", "zeros", True), ("v_cache", "zeros", True), ("steps", "file", False)]
    assert [s.name for s in m.inputs] == ["x", "pos", "k_cache", "v_cache", "steps"]
    model = load(built(KV))
    assert [s.name for s in model.inputs] == ["x", "pos"] and [s.name for s in model.outputs] == ["output"]
    assert int(model.state()["steps"]) == 7  # a non-zero initial value, from the package's state file


def test_every_call_equals_eager_and_updates_the_state():
    model, eager = load(built(KV)), load_module(MODELS / "kv_cache.py").model()
    for x, pos in _steps(0):
        np.testing.assert_allclose(model(x.numpy(), pos.numpy()), _eager(eager, x, pos), rtol=1e-5, atol=1e-5)
        state = model.state()
        for name in ("k_cache", "v_cache", "steps"):
            np.testing.assert_allclose(state[name], getattr(eager, name).numpy(), rtol=1e-5, atol=1e-6)
    assert int(model.state()["steps"]) == 7 + 6
    out = model(x=torch.randn(1, 1, 32), pos=torch.tensor([8]))  # torch in, torch out; by name
    assert isinstance(out, torch.Tensor)


def test_an_in_place_cache_write_touches_only_the_written_rows_and_copies_them_all_when_not_in_place():
    """The cache write stores only the rows the call writes when its state output is its state input (the loader
    passes one array: SPEC §2b in_place), and copies every other row when they are two arrays (ir.kept_elsewhere):
    the graph run with the state as plain inputs and fresh outputs equals eager too."""
    model, eager = load(built(KV)), load_module(MODELS / "kv_cache.py").model()
    source = model.archive.read("src/cpu/model.cpp").decode()
    assert "static_cast<const void*>(state_out_k_cache) != static_cast<const void*>(state_k_cache)" in source
    for x, pos in _steps(4):
        old = [getattr(eager, n).numpy().copy() for n in ("k_cache", "v_cache", "steps")]
        want = _eager(eager, x, pos)
        out, k_cache, v_cache, steps = model.base.run_arrays([x.numpy(), pos.numpy(), *old], {})  # fresh outputs
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        for got, name in ((k_cache, "k_cache"), (v_cache, "v_cache"), (steps, "steps")):
            np.testing.assert_allclose(got, getattr(eager, name).numpy(), rtol=1e-5, atol=1e-6)


def test_sessions_interleaved_each_equal_to_its_own_eager_run():
    model = load(built(KV))
    module = load_module(MODELS / "kv_cache.py")
    a, b = model.new_session(), model.new_session()
    eager_a, eager_b = module.model(), module.model()
    for (xa, pa), (xb, pb) in zip(_steps(1), _steps(2)):
        np.testing.assert_allclose(a(xa.numpy(), pa.numpy()), _eager(eager_a, xa, pa), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(b(xb.numpy(), pb.numpy()), _eager(eager_b, xb, pb), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a.state()["k_cache"], eager_a.k_cache.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.state()["k_cache"], eager_b.k_cache.numpy(), rtol=1e-5, atol=1e-6)
    assert int(model.state()["steps"]) == 7  # the model's own session was never called


def test_reset_state_starts_over():
    model = load(built(KV))
    steps = _steps(3, 2)
    first = [model(x.numpy(), p.numpy()) for x, p in steps]
    model.reset_state()
    assert int(model.state()["steps"]) == 7 and not model.state()["k_cache"].any()
    again = [model(x.numpy(), p.numpy()) for x, p in steps]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_a_position_outside_the_cache_fails_and_keeps_the_state():
    model = load(built(KV))
    x, pos = _steps(4, 0)[0]
    model(x.numpy(), pos.numpy())
    before = model.state()
    with pytest.raises(RuntimeKernelError, match=r"out of range.*kv_cache.py:\d+"):
        model(np.zeros((1, 1, 32), np.float32), np.array([16]))
    after = model.state()
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])


def test_the_state_is_not_an_input():
    model = load(built(KV))
    with pytest.raises(ArityError, match="no input named 'k_cache'"):
        model(np.zeros((1, 1, 32), np.float32), np.array([0]), k_cache=np.zeros((1, 4, 16, 8), np.float32))


@pytest.mark.parametrize("edit, message", [
    (lambda s: s[0].update(input=99), r"state\[0\].input 99 should be a distinct index"),
    (lambda s: s[1].update(input=2), r"state\[1\].input 2 should be a distinct index"),
    (lambda s: s[0].update(output=3), r"pairs input k_cache float32.* with output steps int64"),
    (lambda s: s[2].update(initial="ones"), r"state\[2\].initial should be one of"),
    (lambda s: s[0].update(in_place="yes"), r"state\[0\].in_place should be true or false"),
])
def test_a_bad_state_section_is_a_format_error(edit, message):
    d = json.loads(open_archive(built(KV)).manifest.dumps())
    edit(d["state"])
    with pytest.raises(FormatError, match=message):
        parse_manifest(json.dumps(d).encode())


def test_a_state_file_that_does_not_match_is_refused():
    from tcexport.loader.state import initial_state

    archive = open_archive(built(KV))
    m = archive.manifest
    bad = dataclasses.replace(m, inputs=m.inputs[:4] + (dataclasses.replace(m.inputs[4], dtype="int32"),))
    with pytest.raises(FormatError, match="state 'steps' should start from a int32"):
        initial_state(archive, bad)


@functools.lru_cache(maxsize=None)
def _lm_package(kind: str, cache: int = 128):
    """examples/lm_cache.py's small ``kind`` model, exported once per session (the file reads its size from
    the environment, set here for the export alone)."""
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export

    saved = {k: os.environ.get(k) for k in ("TCEXPORT_LM", "TCEXPORT_LM_SIZE", "TCEXPORT_LM_CACHE")}
    os.environ.update(TCEXPORT_LM=kind, TCEXPORT_LM_SIZE="small", TCEXPORT_LM_CACHE=str(cache))
    try:
        spec = load_model_file(str(EXAMPLES / "lm_cache.py"))
        path = WORK / f"lm-{kind}-{cache}.tcpkg"
        export(spec.module, spec.example_inputs, spec.dynamic_shapes, name=kind, source_path=str(spec.path)).save(path)
        return path, load_module(EXAMPLES / "lm_cache.py")
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(params=["gpt2", "llama"])
def lm(request):
    path, file = _lm_package(request.param)
    return load(path), file


def test_greedy_generation_equals_transformers_generate(lm):
    model, file = lm
    generate = load_module(EXAMPLES / "generate.py").generate
    prompt = [5, 6, 7, 8]
    hf = file.hf_model()
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)[0, len(prompt):].tolist()
    assert len(want) == 64
    assert generate(model, prompt, 64) == want


def test_greedy_generation_over_a_cache_read_in_blocks_equals_transformers():
    """A 512-entry cache: the prompt and every decode step run the CPU's fused attention (schedule/cpu.py), which
    reads the grouped KV heads in place and skips the blocks past the position."""
    path, file = _lm_package("llama", 512)
    assert any(k.endswith("_attention") for k in open_archive(path).manifest.graphs["inference"].cpu.kernels)
    generate = load_module(EXAMPLES / "generate.py").generate
    prompt = [5, 6, 7, 8]
    with torch.no_grad():
        want = file.hf_model().generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)
    assert generate(load(path), prompt, 64) == want[0, len(prompt):].tolist()


def test_sampling_is_seeded(lm):
    model, _ = lm
    generate = load_module(EXAMPLES / "generate.py").generate
    a = generate(model, [1, 2], 16, top_k=20, top_p=0.9, seed=5)
    assert a == generate(model, [1, 2], 16, top_k=20, top_p=0.9, seed=5)
    assert generate(model, [1, 2], 16, top_k=1, seed=9) == generate(model, [1, 2], 16)


@pytest.mark.parametrize("cache", [16, 512])
def test_cuda_kernels_in_the_interpreter(cache):
    """The GPU kernels (the cache write, attention over the cache) in Triton's interpreter: the graph with its
    state as plain inputs and outputs, a prompt then a decode step, each against eager. A 512-entry cache
    splits its keys over 4 programs a head (schedule/split_kv.py), and skips the blocks past the position."""
    from tcexport.exporter.check.interpret import run_interpreted
    from tcexport.exporter.pipeline import export

    module = load_module(MODELS / "kv_cache.py")
    path = WORK / f"kv_cache-cuda-{cache}.tcpkg"
    pkg = export(module.model(cache), module.example_inputs(), module.dynamic_shapes, "cuda:sm_90",
                 name="kv_cache", build_cubins=False)
    pkg.save(path)
    assert any(launch.name.endswith("_split") for launch in pkg.manifest.cuda.launches) == (cache == 512)
    eager = module.model(cache)
    cases, want = [], []
    for x, pos in _steps(6, 1):
        state = [eager.k_cache.numpy().copy(), eager.v_cache.numpy().copy(), eager.steps.numpy().copy()]
        out = _eager(eager, x, pos)
        cases.append([x.numpy(), pos.numpy(), *state])
        want.append([out] + [getattr(eager, n).numpy().copy() for n in ("k_cache", "v_cache", "steps")])
    for got, expected in zip(run_interpreted(path, cases), want):
        for g, w in zip(got, expected):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_a_stateful_package_is_not_batched():
    from tcexport.formats.errors import TcError
    from tcexport.loader import Batcher

    with pytest.raises(TcError, match="has state .*k_cache.*new_session"):
        Batcher(load(built(KV)))


@pytest.mark.parametrize("option, message", [
    (dict(onnx="file"), r"--onnx: the model keeps state \(k_cache, v_cache, steps"),
    (dict(precision="bf16"), r"--precision bf16: the model writes its buffers in forward \(k_cache"),
])
def test_options_that_cannot_keep_state_say_so(option, message):
    from tcexport.exporter.errors import ExportError
    from tcexport.exporter.pipeline import export

    module = load_module(MODELS / "kv_cache.py")
    with pytest.raises(ExportError, match=message):
        export(module.model(), module.example_inputs(), module.dynamic_shapes, **option)
