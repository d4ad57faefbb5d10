"""CUDA training packages (``--backward`` with a cuda target) checked without a GPU: each training graph's Triton
kernels run in Triton's interpreter and give float64 autograd's gradients (MLP, CNN, decoder, a scalar loss);
cubins build for sm_90 next to the CPU library; the manifest's ``training.*.cuda`` sections and their FormatErrors.
tests/test_cuda_gpu_training.py runs the same packages on a GPU."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from tcexport.exporter.cuda.build import cubin_arch  # noqa: E402
from tcexport.exporter.check.interpret import run_training_interpreted  # noqa: E402
from tcexport.formats.errors import FormatError, TcError  # noqa: E402
from tcexport.formats.manifest import parse_manifest  # noqa: E402
from tcexport.loader.archive import open_archive  # noqa: E402
from loader_helpers import as_1_7  # noqa: E402
from training_packages import (assert_gradients_close, module, random_inputs, reference_gradients,  # noqa: E402
                               training_package)

pytestmark = pytest.mark.slow


# shapes at both ends of small ranges; the interpreter runs every program of every kernel on the CPU
CASES = {"mlp": [(1, 64), (7, 64)], "cnn": [(1, 3, 32, 32)], "decoder": [(1, 3), (2, 5)]}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.long) if n == "decoder" else n
                                  for n in CASES])  # the decoder's kernels: -m long (mlp and cnn every run)
def test_training_kernels_match_float64_autograd_in_the_interpreter(name):
    grad_inputs = ("x",) if name == "mlp" else ()
    path = training_package(name, *grad_inputs, targets="cuda:sm_90", build_cubins=False)
    cases = []
    for shape in CASES[name]:
        xs = random_inputs(name, shape, seed=sum(shape))
        with torch.no_grad():
            out = module(name)(*[torch.from_numpy(x) for x in xs])
        g = np.random.default_rng(len(shape)).standard_normal(tuple(out.shape), dtype=np.float32)
        cases.append((xs, [g]))
    for (xs, gs), (outs, grads) in zip(cases, run_training_interpreted(path, cases)):
        ref_out, ref_grads = reference_gradients(name, xs, gs, grad_inputs)
        np.testing.assert_allclose(outs[0], ref_out[0], rtol=1e-4, atol=1e-5, err_msg=f"{name} output")
        assert len(outs) == len(open_archive(path).manifest.training.forward.outputs)
        assert_gradients_close(grads, ref_grads)


def test_scalar_loss_takes_gradient_one_in_the_interpreter():
    """A model returning its loss: no output gradient is passed, the backward starts from 1."""
    path = training_package("classifier", targets="cuda:sm_90", build_cubins=False)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((5, 16), dtype=np.float32), rng.integers(0, 4, 5).astype(np.int64)]
    (outs, grads), = run_training_interpreted(path, [(xs, None)])
    ref_out, ref_grads = reference_gradients("classifier", xs, None)
    np.testing.assert_allclose(outs[0], ref_out[0], rtol=1e-5)
    assert_gradients_close(grads, ref_grads)


@pytest.fixture(scope="module")
def cubin_package():
    return training_package("mlp", "x", targets="cpu,cuda:sm_90")


def test_cubins_for_every_training_launch(cubin_package):
    archive = open_archive(cubin_package)
    m = archive.manifest
    assert [k.target for k in m.kernels if k.target != "cpu"] == ["cuda:sm_90"]
    for graph in (m.training.forward, m.training.backward):
        c = graph.cuda
        assert c.source in m.sources and f"def {c.launches[0].name}(" in archive.read(c.source).decode()
        assert list(c.cubins) == ["sm_90"]
        assert [x.kernel for x in c.cubins["sm_90"]] == [l.name for l in c.launches]
        for x in c.cubins["sm_90"]:
            assert x.file == f"kernels/cuda-sm_90/{graph.entry}/{x.kernel}.cubin"
            assert cubin_arch(archive.read(x.file)) == 90 and x.num_warps >= 1
    params = [p for l in m.training.backward.cuda.launches for p in l.params]
    inputs = {p["value"] for p in params if p["kind"] == "input"}
    assert inputs <= set(range(len(m.training.backward.inputs))) and inputs
    assert {p["value"] for p in params if p["kind"] == "output"} == set(range(len(m.training.backward.outputs)))


def test_inference_launches_are_the_inference_only_packages():
    """--backward adds entry points; the inference launch list is what a plain CUDA export packages, but for the
    weights' layout: a plain package stores its linear weights [K, N] (front/weights_kn.py), a training package the
    model's parameters as they are, so their kernels read them by other strides."""
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export
    from training_packages import MODEL_FILES

    spec = load_model_file(MODEL_FILES["mlp"])
    plain = export(spec.module, spec.example_inputs, spec.dynamic_shapes, "cuda:sm_90", name="mlp",
                   build_cubins=False).manifest
    trained = open_archive(training_package("mlp", "x", targets="cuda:sm_90", build_cubins=False)).manifest
    same = lambda launches: [(x.name, x.grid, x.block, x.num_warps, x.num_stages) for x in launches]  # noqa: E731
    assert same(trained.cuda.launches) == same(plain.cuda.launches)
    stored_kn = {w.name for w in plain.weights if w.name.endswith(".T")}
    assert stored_kn and {w.name for w in plain.weights} - stored_kn | {n[:-2] for n in stored_kn} \
        == {w.name for w in trained.weights}
    assert trained.cuda.workspace_bytes == plain.cuda.workspace_bytes


def test_the_cpu_library_in_the_same_package_still_trains(cubin_package):
    import tcexport.loader as L

    m = L.load(cubin_package)
    x = np.random.default_rng(0).standard_normal((3, 64), dtype=np.float32)
    out, saved = m.forward(x, grad=True)
    g = np.ones_like(out)
    ref_out, ref_grads = reference_gradients("mlp", [x], [g], ("x",))
    assert_gradients_close(m.backward(saved, g), ref_grads)


def test_loading_on_cuda_without_a_gpu_is_a_clear_error(cubin_package):
    import tcexport.loader as L

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(TcError, match="cuda"):
        L.load(cubin_package, device="cuda")


# --- the format (SPEC §6b, 1.3) ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifest_json(cubin_package) -> dict:
    return json.loads(open_archive(cubin_package).manifest.dumps())


def test_round_trip_and_older_packages(manifest_json):
    m = parse_manifest(manifest_json)
    assert json.loads(m.dumps()) == manifest_json
    assert m.training.forward.cuda.workspace_bytes == manifest_json["graphs"]["forward"]["cuda"]["workspace_bytes"]
    assert m.cuda.kernels and m.graphs["backward"].cuda.kernels  # each graph's GPU kernel list (1.8)
    old = parse_manifest(as_1_7(manifest_json))  # the same package as 1.7 wrote it: the same graphs, less 1.8's
    assert old.graphs["backward"].cuda == replace(m.graphs["backward"].cuda, triton="", kernels=())
    assert old.cuda == replace(m.cuda, kernels=())
    older = as_1_7(manifest_json)  # a 1.2 training package: CPU entry points only, an inference CUDA bundle
    for g in ("forward", "backward"):
        del older["training"][g]["cuda"]
    older["format_version"] = [1, 2]
    t = parse_manifest(older).training
    assert t.forward.cuda is None and t.backward.cuda is None
    no_cubins = as_1_7(manifest_json)  # interpreter-only: no CUDA bundles, no cubins (the defaults)
    no_cubins["kernels"] = [k for k in no_cubins["kernels"] if k["target"] == "cpu"]
    del no_cubins["cuda"]
    for g in ("forward", "backward"):
        del no_cubins["training"][g]["cuda"]["cubins"]
        del no_cubins["training"][g]["cuda"]["index_bits"]
    assert parse_manifest(no_cubins).training.backward.cuda.cubins == {}


def _broken(d: dict, edit) -> dict:
    d = copy.deepcopy(d)
    edit(d)
    return d


def _first_param(kind):
    def edit(d):
        launch = next(l for l in d["graphs"]["backward"]["cuda"]["launches"]
                      if any(p["kind"] == kind for p in l["params"]))
        next(p for p in launch["params"] if p["kind"] == kind)["value"] = 99
    return edit


BROKEN = [
    ("one graph only", lambda d: d["graphs"]["forward"].pop("cuda"), "should both have 'cuda' or neither"),
    ("no cubins for the bundle", lambda d: d["graphs"]["backward"]["cuda"]["cubins"].pop("sm_90"),
     r"graphs.backward.cuda.cubins has no entry for the package's CUDA bundle sm_90"),
    ("cubins out of order", lambda d: d["graphs"]["forward"]["cuda"]["cubins"]["sm_90"].reverse(),
     r"graphs.forward.cuda.cubins\['sm_90'\] should have one cubin per launch"),
    ("input out of range", _first_param("input"), r"graphs.backward.cuda.launches\[\d+\].params\[\d+\] refers to input 99"),
    ("output out of range", _first_param("output"), r"refers to output 99"),
    ("unlisted source", lambda d: d["graphs"]["forward"]["cuda"].update(source="src/cuda/training/nope.py"),
     "refers to member 'src/cuda/training/nope.py', which is not listed"),
    ("bad index bits", lambda d: d["graphs"]["forward"]["cuda"].update(index_bits=16), "index_bits should be 32 or 64"),
    ("bad workspace", lambda d: d["graphs"]["backward"]["cuda"].update(workspace_bytes=["*", "nosym"]),
     "graphs.backward.cuda.workspace_bytes"),
]


@pytest.mark.parametrize("what, edit, message", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_training_cuda_section(manifest_json, what, edit, message):
    with pytest.raises(FormatError, match=message):
        parse_manifest(_broken(manifest_json, edit))
