"""Tuned GPU packages without a GPU: a recorded tuning (manifest ``cuda.tuning``, made by ``--autotune`` on a GPU
machine) replaces the tile heuristics, rebuilding from such a package is byte-identical, the tuned kernels still
match eager in Triton's interpreter, and every misuse is a clear error. Autotuning itself needs a GPU: see
test_cuda_gpu.py."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from tcexport.exporter import export, pipeline  # noqa: E402
from tcexport.exporter.tune.autotune import _canonical, _shape, candidates, families, parse_at, regenerate  # noqa: E402
from tcexport.exporter.errors import BuildError, ExportError  # noqa: E402
from tcexport.exporter.front.model_file import load_model_file  # noqa: E402
from tcexport.exporter.check.interpret import run_interpreted  # noqa: E402
from tcexport.formats.errors import FormatError  # noqa: E402
from tcexport.formats.manifest import parse_manifest  # noqa: E402
from tcexport.loader.archive import open_archive  # noqa: E402
from packages import EXAMPLES, WORK  # noqa: E402

DECODER = EXAMPLES / "decoder.py"


def _export(tmp_path, name: str, **kw):
    spec = load_model_file(DECODER)
    pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, kw.pop("targets", "cuda:sm_90"),
                          name="decoder", source_path=str(DECODER), cache_dir=WORK / "cache-tuning", **kw)
    return pkg.save(tmp_path / f"{name}.tcpkg")


@pytest.fixture(scope="module")
def module_state():
    job = pipeline.Job(load_model_file(DECODER), targets=("cuda:sm_90",), build_cubins=False)
    return pipeline.run_stages(job).inference


def _tuning(st) -> dict:
    """Configs other than the heuristics' for an attention family and a GEMM family."""
    fams = families(st.cuda.module)
    attention = next(f for f in fams if f.kind == "attention")
    gemm = next(f for f in fams if f.kind == "gemm" and len(f.indexes) > 1)
    configs = {}
    for fam in (attention, gemm):
        other = candidates(fam, *_shape(st.program, st.cuda.kernels, st.cuda.module, fam.indexes[0]))[1]
        configs |= {st.cuda.module.launches[i].name: other for i in fam.indexes}
    return {"device": "NVIDIA H200", "at": [{"batch": 2, "seq": 8}], "configs": dict(sorted(configs.items()))}


def test_families_group_the_layers_that_share_code(module_state):
    st = module_state
    fams = families(st.cuda.module)
    names = [[st.cuda.module.launches[i].name for i in f.indexes] for f in fams]
    # the decoder's two layers: one flash-attention family (and one of its variant for key lengths that are multiples
    # of 16, tuned apart: it has another grid), and their Q/K/V projections (one GEMM each) in one GEMM family
    attention = [n for n, f in zip(names, fams) if f.kind == "attention"]
    assert attention == [["k4_attention", "k15_attention"], ["k4_attention_a16", "k15_attention_a16"]]
    assert ["k1_gemm", "k13_gemm"] in names  # the joined Q/K/V projection of each layer (front/concat_linears.py)
    # every other family holds both layers' kernels, but for k18 and k24, which have no twin
    assert all(len(n) == 2 for n in names if not n[0].startswith(("k18_", "k24_")))
    assert all(st.cuda.module.tunable[n] in ("gemm", "attention") for group in names for n in group)
    # every candidate is cut to the dims it runs over, and the current config comes first
    for f in fams:
        cands = candidates(f, *_shape(st.program, st.cuda.kernels, st.cuda.module, f.indexes[0]))
        assert cands[0] == f.config and len(cands) == len({json.dumps(c, sort_keys=True) for c in cands}) > 3


def test_every_candidate_keeps_one_code_and_parameter_list_per_family(module_state):
    """Autotune runs one compiled representative for every member of a family with each member's own
    parameters: that is only sound while, for every candidate, the members still share one code and their
    parameter lists are the ones the heuristic build has."""
    st = module_state
    params = {l.name: l.params for l in st.cuda.module.launches}
    for fam in families(st.cuda.module):
        for cfg in candidates(fam, *_shape(st.program, st.cuda.kernels, st.cuda.module, fam.indexes[0])):
            regen, launches = regenerate(st.program, st.cuda.kernels, st.cuda.module, fam, cfg)
            assert {n: l.params for n, l in regen.items()} == {n: params[n] for n in regen}
            codes = {_canonical(codegen_module(launches), l) for l in regen.values()}
            assert len(codes) == 1, (fam.indexes, cfg)
            assert {str(l.grid) for l in regen.values()} and all(
                l.constexprs["BM"] == cfg["BM"] and l.num_warps == cfg["num_warps"] for l in regen.values())


def codegen_module(launches):
    from tcexport.exporter.cuda.module import TritonModule

    return TritonModule("", launches)


def test_a_recorded_tuning_replaces_the_heuristics_and_rebuilds_byte_identical(tmp_path, module_state):
    tuning = _tuning(module_state)
    a = _export(tmp_path, "a", tuning=tuning)
    m = open_archive(a).manifest
    assert m.cuda.tuning == tuning
    by_name = {l.name: l for l in m.cuda.launches}
    for name, cfg in tuning["configs"].items():
        launch = by_name[name]
        assert {**launch.block, "num_warps": launch.num_warps, "num_stages": launch.num_stages} == cfg, name
    b = _export(tmp_path, "b", tuning=a)  # --tuning a.tcpkg: no GPU involved
    assert a.read_bytes() == b.read_bytes()
    plain = _export(tmp_path, "plain")
    assert open_archive(plain).manifest.cuda.tuning is None and plain.read_bytes() != a.read_bytes()


def test_tuned_kernels_match_eager_in_the_interpreter(tmp_path, module_state):
    path = _export(tmp_path, "interp", tuning=_tuning(module_state), build_cubins=False)
    rng = np.random.default_rng(5)
    cases = [[rng.integers(0, 64, size=shape).astype(np.int64)] for shape in ((1, 3), (2, 9), (3, 40))]
    module = load_model_file(DECODER).module.double()
    for xs, got in zip(cases, run_interpreted(path, cases)):
        with torch.no_grad():
            want = module(torch.from_numpy(xs[0])).numpy()
        np.testing.assert_allclose(got[0].astype(np.float64), want, rtol=1e-4, atol=1e-4)


def test_tuning_errors(tmp_path, module_state):
    tuning = _tuning(module_state)

    def first(cfg: dict) -> dict:
        return next(iter(cfg["configs"].values()))

    for edit, message in [
        (lambda t: t["configs"].update(k99_gemm=dict(first(t))), "k99_gemm.*another model"),
        (lambda t: first(t).update(BM=8), "below 16"),
        (lambda t: first(t).update(SPLIT=2), "SPLIT=2 is not a"),
        (lambda t: first(t).update(BM=48), "powers of two"),
        (lambda t: t["configs"]["k4_attention"].update(BD=64), "k4_attention: head blocks BD=64.*another model"),
    ]:
        damaged = copy.deepcopy(tuning)
        edit(damaged)
        with pytest.raises(BuildError, match=message):
            _export(tmp_path, "x", tuning=damaged, build_cubins=False)
    for broken, message in [({"configs": {}}, "no field 'device'"),
                            ({**tuning, "configs": {"k4_attention": "fast"}}, "should map settings to integers"),
                            ({**tuning, "configs": []}, "configs should be dict")]:
        with pytest.raises(ExportError, match=message):
            _export(tmp_path, "x", tuning=broken, build_cubins=False)
    with pytest.raises(ExportError, match="add a cuda target"):
        _export(tmp_path, "x", tuning=tuning, targets="cpu")
    with pytest.raises(ExportError, match="pass one of them"):
        _export(tmp_path, "x", tuning=tuning, autotune=True)
    plain = _export(tmp_path, "plain", build_cubins=False)
    with pytest.raises(ExportError, match="no cuda.tuning; take one built with --autotune"):
        _export(tmp_path, "x", tuning=plain, build_cubins=False)
    assert parse_at(["batch=1", "batch=8, seq=64"]) == [{"batch": 1}, {"batch": 8, "seq": 64}] and parse_at([]) == [{}]
    with pytest.raises(ExportError, match="'batch' should be SYMBOL=SIZE"):
        parse_at(["batch"])
    with pytest.raises(ExportError, match="add --autotune"):
        _export(tmp_path, "x", autotune_at=["batch=2"])
    with pytest.raises(ExportError, match="add a cuda target"):
        _export(tmp_path, "x", targets="cpu", autotune=True)
    if not torch.cuda.is_available():
        with pytest.raises(ExportError, match="torch sees no CUDA device"):
            _export(tmp_path, "x", autotune=True)


def test_manifest_tuning_is_checked(tmp_path, module_state):
    d = json.loads(open_archive(_export(tmp_path, "m", tuning=_tuning(module_state), build_cubins=False))
                   .manifest.dumps())
    assert parse_manifest(d).cuda.tuning == d["cuda"]["tuning"]
    for edit, message in [
        (lambda t: t["configs"].update(k99_gemm={"BM": 64}), "names launch 'k99_gemm'"),
        (lambda t: t["at"].append({"batch": "8"}), "should map symbol names to integers"),
        (lambda t: next(iter(t["configs"].values())).update(BM=True), "should map settings to integers"),
        (lambda t: t.pop("device"), "has no field 'device'"),
    ]:
        broken = copy.deepcopy(d)
        edit(broken["cuda"]["tuning"])
        with pytest.raises(FormatError, match=message):
            parse_manifest(broken)
