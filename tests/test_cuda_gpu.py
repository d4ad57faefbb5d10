"""GPU packages on a real GPU: the examples and transformers models, loaded through the CUDA driver and compared
with eager (float64 on the CPU). Skips cleanly where there is no GPU (CI).

``TCEXPORT_PREBUILT=DIR`` takes the packages from DIR (built on a CPU-only machine by
``python tests/gpu_packages.py DIR``); without it they are built here for this GPU's arch.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import tcexport.loader as L  # noqa: E402
from tcexport.exporter.front.model_file import load_model_file  # noqa: E402
from tcexport.formats import errors as E  # noqa: E402
from gpu_packages import BFLOAT16, MODELS as CASES, build  # noqa: E402
from packages import WORK  # noqa: E402

ARCH = "sm_%d%d" % torch.cuda.get_device_capability()


def package(name: str) -> Path:
    folder = os.environ.get("TCEXPORT_PREBUILT")
    if folder:
        return Path(folder) / f"{name}.tcpkg"
    return build(name, WORK / "gpu", f"cuda:{ARCH}")


def _inputs(path, shapes, seed=0):
    spec = load_model_file(path)
    g = torch.Generator().manual_seed(seed)
    out = []
    for example, shape in zip(spec.example_inputs, shapes):
        if example.dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g).to(example.dtype))
        else:
            out.append(torch.randint(0, int(example.max()) + 1, shape, generator=g).to(example.dtype))
    return spec, out


def _reference(spec, xs):
    module = spec.module.double()
    with torch.no_grad():
        out = module(*[x.double() if x.is_floating_point() else x for x in xs])
    return out if isinstance(out, (tuple, list)) else (out,)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_eager(name):
    path, shapes_list = CASES[name]
    model = L.load(package(name), device="cuda")
    tol = 2e-2 if name in BFLOAT16 else 2e-4
    for shapes in shapes_list:
        spec, xs = _inputs(path, shapes)
        got = model(*[x.cuda() for x in xs])
        got = got if isinstance(got, tuple) else (got,)
        want = _reference(spec, xs)
        for g, w in zip(got, want):
            assert g.is_cuda and tuple(g.shape) == tuple(w.shape)
            torch.testing.assert_close(g.cpu().double(), w, rtol=tol, atol=tol, msg=f"{name} {shapes}")


def test_persistent_gemms_walk_their_tiles_with_one_program_per_sm():
    """lm_head's GEMMs over 256 rows run min(SM count, tiles) programs with TMA descriptors in global scratch
    the loader reserves: at 320 and 1024 rows they agree bit for bit with and without graphs and dependent
    launch, and with eager (bfloat16 tolerance, test_matches_eager)."""
    path, shapes_list = CASES["lm_head"]
    graphs = L.load(package("lm_head"), device="cuda")
    direct = L.load(package("lm_head"), device="cuda", graphs=False, dependent_launch=False)
    persistent = [k for k in graphs._kernels if k.scratch]
    if torch.cuda.get_device_capability() >= (9, 0):  # TMA: Triton builds its descriptors in global scratch
        assert len(persistent) == 2 and graphs._scratch[1] >= 256 * graphs.device.sm_count
    for shapes in shapes_list[2:] * 2:
        _, xs = _inputs(path, shapes, seed=4)
        x = xs[0].cuda()
        for a, b in zip(graphs(x), direct(x)):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=str(shapes))


def test_graphs_and_direct_launches_agree_across_shapes():
    path, shapes_list = CASES["decoder"]
    with_graphs = L.load(package("decoder"), device="cuda")
    direct = L.load(package("decoder"), device="cuda", graphs=False)
    for shapes in shapes_list * 2:  # the second round replays cached graphs
        _, xs = _inputs(path, shapes, seed=3)
        xs = [x.cuda() for x in xs]
        torch.testing.assert_close(with_graphs(*xs), direct(*xs), rtol=0, atol=0)
    # the decoder's output comes from its last kernel: each graph is launched in two parts, the outputs allocated
    # between them (cuda_model._Graph)
    assert [len(g.parts) for g in with_graphs._graph_cache.values()] == [2] * len(shapes_list)


@pytest.mark.skipif(torch.cuda.get_device_capability() < (9, 0), reason="programmatic dependent launch is sm_90+")
def test_kernels_started_before_the_previous_one_ends_compute_the_same():
    """On sm_90 each graph kernel hangs off the one before it by a programmatic edge: it is scheduled while that
    one finishes and waits for its writes inside (griddepcontrol.wait). A kernel reading before that wait would
    read the previous replay's values; repeated replays at several shapes agree bit for bit with ordinary edges."""
    path, shapes_list = CASES["hf_gpt2"]
    overlapped = L.load(package("hf_gpt2"), device="cuda")
    ordered = L.load(package("hf_gpt2"), device="cuda", dependent_launch=False)
    assert all(c.dependent for c in overlapped.manifest.cubins(overlapped.bundle.isa))
    for shapes in shapes_list:
        calls = [[x.cuda() for x in _inputs(path, shapes, seed=seed)[1]] for seed in (7, 8)]
        wants = [ordered(*xs) for xs in calls]
        for _ in range(10):  # alternating inputs: a read before the wait would see the other call's temps
            for xs, want in zip(calls, wants):
                torch.testing.assert_close(overlapped(*xs), want, rtol=0, atol=0, msg=str(shapes))
    assert overlapped.device.programmatic_edges  # the driver took them (CUDA 12.3+)


def test_graph_replays_read_and_write_each_calls_own_buffers():
    """A replay re-points the graph at the call's inputs and outputs (no copy through graph-owned memory): outputs
    kept from earlier calls stay as they were, and reused, misaligned and host inputs give the direct result."""
    path, shapes_list = CASES["mlp"]
    with_graphs = L.load(package("mlp"), device="cuda")
    direct = L.load(package("mlp"), device="cuda", graphs=False)
    _, xs = _inputs(path, shapes_list[1], seed=5)
    x = xs[0].cuda()
    kept = [(xi, with_graphs(xi)) for xi in (x, x * 2, x, x + 1)]  # each output at a new address, x twice
    assert len({y.data_ptr() for _, y in kept}) == len(kept)
    for xi, y in kept:
        torch.testing.assert_close(y, direct(xi), rtol=0, atol=0)
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view(x.shape)
    shifted.copy_(x)
    assert shifted.data_ptr() % 16
    torch.testing.assert_close(with_graphs(shifted), kept[0][1], rtol=0, atol=0)
    np.testing.assert_array_equal(with_graphs(xs[0].numpy()), kept[0][1].cpu().numpy())


def test_autotune_records_a_tuning_that_rebuilds_byte_identical(tmp_path):
    """--autotune on this GPU at two shapes: the choice is in the manifest, the tuned package matches eager, and
    building again from it (--tuning, which needs no GPU) gives the same bytes."""
    from tcexport.exporter import export
    from tcexport.loader.archive import open_archive

    path, shapes_list = CASES["decoder"]
    spec = load_model_file(path)
    kw = dict(name="decoder", source_path=str(path), cache_dir=WORK / "cache-autotune")
    tuned = export(spec.module, spec.example_inputs, spec.dynamic_shapes, f"cuda:{ARCH}", autotune=True,
                   autotune_at=["batch=1,seq=100", "batch=16,seq=128"], dump=tmp_path / "dump", **kw)
    tuned = tuned.save(tmp_path / "tuned.tcpkg")
    t = open_archive(tuned).manifest.cuda.tuning
    assert t["device"] == torch.cuda.get_device_name() and t["configs"]
    assert t["at"] == [{"batch": 1, "seq": 100}, {"batch": 16, "seq": 128}]
    assert "tuned:" in (tmp_path / "dump" / "autotune.txt").read_text()
    again = export(spec.module, spec.example_inputs, spec.dynamic_shapes, f"cuda:{ARCH}", tuning=tuned, **kw)
    assert again.save(tmp_path / "again.tcpkg").read_bytes() == tuned.read_bytes()
    model = L.load(tuned, device="cuda")
    for shapes in shapes_list:
        _, xs = _inputs(path, shapes, seed=6)
        torch.testing.assert_close(model(xs[0].cuda()).cpu().double(), _reference(spec, xs)[0],
                                   rtol=2e-4, atol=2e-4)


def test_close_gives_the_device_memory_back():
    """A server swapping models: close() frees the weights, workspaces and graphs and unloads the kernels; the
    closed model raises instead of reading freed memory."""
    path, shapes_list = CASES["hf_gpt2"]
    _, xs = _inputs(path, shapes_list[-1], seed=7)
    x = xs[0].cuda()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.mem_get_info()[0]
    with L.load(package("hf_gpt2"), device="cuda") as model:
        model(x)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        during = torch.cuda.mem_get_info()[0]
    torch.cuda.empty_cache()
    after = torch.cuda.mem_get_info()[0]
    assert during < before and after >= before - (4 << 20), (before, during, after)
    model.close()  # twice is fine
    with pytest.raises(E.TcError, match="was closed"):
        model(x)


def test_runs_on_the_callers_stream():
    path, shapes_list = CASES["mlp"]
    model = L.load(package("mlp"), device="cuda")
    spec, xs = _inputs(path, shapes_list[0])
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = xs[0].cuda()
        y = model(x)
    stream.synchronize()
    torch.testing.assert_close(y.cpu().double(), _reference(spec, xs)[0], rtol=2e-4, atol=2e-4)


def test_out_of_range_index_raises():
    model = L.load(package("decoder"), device="cuda")
    direct = L.load(package("decoder"), device="cuda", graphs=False)
    ok = torch.tensor([[1, 2, 3]], device="cuda")
    want = direct(ok)
    torch.testing.assert_close(model(ok), want, rtol=0, atol=0)
    # the graph waits only for its copy of the error word after the last kernel that reads indices
    assert next(iter(model._graph_cache.values())).probed
    for m in (model, direct):  # a replay of that graph, and direct launches
        with pytest.raises(E.RuntimeKernelError, match="out of range"):
            m(torch.tensor([[1, 2, 10**6]], device="cuda"))
        torch.testing.assert_close(m(ok), want, rtol=0, atol=0)  # the error word was reset


@pytest.mark.parametrize("graphs", [True, False])
def test_calls_on_two_streams_do_not_overlap(graphs):
    """A call returns before its kernels finish; the next call on another stream waits for them (the graph's
    staging and the workspace are the model's, not the call's)."""
    model = L.load(package("mlp"), device="cuda", graphs=graphs)
    rng = np.random.default_rng(5)
    # misaligned views, which every call copies into the model's own memory before its kernels read them
    flat = [torch.from_numpy(rng.standard_normal(1024 * 64 + 1).astype(np.float32)).cuda() for _ in range(6)]
    xs = [f[1:].view(1024, 64) for f in flat]
    want = [model(x).clone() for x in xs]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    got = []
    for i, x in enumerate(xs):
        with torch.cuda.stream(streams[i % 2]):
            torch.cuda._sleep(2_000_000)  # both streams busy ~1 ms: unordered, their calls would run together
            got.append(model(x))
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_guards_on_gpu():
    model = L.load(package("mlp"), device="cuda")
    with pytest.raises(E.DtypeError):
        model(torch.zeros(2, 64, dtype=torch.float64, device="cuda"))
    with pytest.raises(E.StaticDimError):
        model(torch.zeros(2, 63, device="cuda"))
    with pytest.raises(E.TargetError):
        model(torch.zeros(2, 64))


def test_cupy_in_cupy_out():
    cupy = pytest.importorskip("cupy")
    path, shapes_list = CASES["mlp"]
    model = L.load(package("mlp"), device="cuda")
    spec, xs = _inputs(path, shapes_list[0])
    y = model(cupy.asarray(xs[0].numpy()))
    assert isinstance(y, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(y), _reference(spec, xs)[0].numpy(), rtol=2e-4, atol=2e-4)
