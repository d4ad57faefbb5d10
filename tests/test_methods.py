"""Methods (SPEC §2c): several named entry points in one package, sharing weights and state. Each method equals
eager; methods interleaved on one session equal eager's sequence; sessions do not see each other; the weights are
stored once; mistakes are typed errors naming the method; the CLI builds and shows them; the GPU kernels build
(sm_90 cubins on this CPU machine) and run in Triton's interpreter."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from packages import EXAMPLES, MODELS, WORK, load_module
from tcexport.exporter.errors import MethodError
from tcexport.formats.errors import FormatError, StaticDimError, TcError, UnknownMethodError
from tcexport.formats.manifest import parse_manifest
from tcexport.loader import load
from tcexport.loader.archive import open_archive

KV = MODELS / "kv_methods.py"
pytestmark = pytest.mark.slow


@functools.lru_cache(maxsize=None)
def _package(targets: str = "cpu", build_cubins: bool = True):
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export

    spec = load_model_file(str(KV))
    path = WORK / f"kv_methods-{targets.replace(':', '_')}-{build_cubins}.tcpkg"
    export(spec.module, methods=spec.methods, targets=targets, name="kv_methods", source_path=str(KV),
           build_cubins=build_cubins).save(path)
    return path


def _eager():
    return load_module(KV).model()


def _prompt(g):
    return torch.randn(1, 3, 32, generator=g), torch.arange(3)


def _token(g, position: int):
    return torch.randn(1, 1, 32, generator=g), torch.tensor([position])


def _run(eager, fn: str, x, pos):
    with torch.no_grad():
        return getattr(eager, fn)(x, pos).numpy()


def test_manifest_names_the_methods_and_keeps_one_weights_file():
    m = open_archive(_package()).manifest
    assert m.format_version == (1, 10)
    assert m.method_names() == ["prefill", "decode"]
    assert list(m.graphs) == ["inference", "decode"]
    assert m.graphs["decode"].cpu.entry == "tc_run_method_decode"
    decode = m.method("decode")
    assert [s.name for s in decode.symbols] == [] and [s.name for s in m.symbols] == ["seq"]
    assert [s.name for s in decode.state] == ["k_cache", "v_cache", "steps"]
    # weights stored once: one safetensors member holding each parameter once, the size of one copy
    names = zipfile.ZipFile(_package()).namelist()
    assert [n for n in names if n.endswith(".safetensors")] == ["state.safetensors", "weights.safetensors"]
    assert [w.name for w in m.weights] == ["qkv.weight", "qkv.bias", "out.weight", "out.bias"]
    params = sum(p.numel() * 4 for p in _eager().parameters())
    assert params <= m.members["weights.safetensors"]["size"] < params + 1024


def test_each_method_equals_eager_and_they_share_one_state():
    model, eager = load(_package()), _eager()
    g = torch.Generator().manual_seed(0)
    x, pos = _prompt(g)
    np.testing.assert_allclose(model.methods["prefill"](x.numpy(), pos.numpy()), _run(eager, "forward", x, pos),
                               rtol=1e-5, atol=1e-5)
    for step in range(4):  # decode, then prefill again over one position, interleaved: eager's own sequence
        x, pos = _token(g, 3 + step)
        name, fn = ("decode", "step") if step % 2 == 0 else ("prefill", "forward")
        np.testing.assert_allclose(model.methods[name](x.numpy(), pos.numpy()), _run(eager, fn, x, pos),
                                   rtol=1e-5, atol=1e-5)
        state = model.state()
        for buf in ("k_cache", "v_cache", "steps"):
            np.testing.assert_allclose(state[buf], getattr(eager, buf).numpy(), rtol=1e-5, atol=1e-6)
    assert int(model.state()["steps"]) == 7 + 5


def test_sessions_do_not_see_each_other():
    model = load(_package())
    a, b = model.new_session(), model.new_session()
    ea, eb = _eager(), _eager()
    ga, gb = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    for k, (s, e, g) in enumerate([(a, ea, ga), (b, eb, gb), (a, ea, ga)]):
        x, pos = _prompt(g) if k < 2 else _token(g, 3)
        name, fn = ("prefill", "forward") if k < 2 else ("decode", "step")
        np.testing.assert_allclose(s.methods[name](x.numpy(), pos.numpy()), _run(e, fn, x, pos), rtol=1e-5,
                                   atol=1e-5)
    assert int(a.state()["steps"]) == 9 and int(b.state()["steps"]) == 8
    assert int(model.state()["steps"]) == 7  # the default session was not called
    a.reset_state()
    assert int(a.state()["steps"]) == 7


def test_unknown_method_and_a_plain_call_say_what_exists():
    model = load(_package())
    with pytest.raises(UnknownMethodError, match=r"no method 'verify'; its methods are \['prefill', 'decode'\]"):
        model.methods["verify"]
    assert "decode" in model.methods and "verify" not in model.methods and model.methods.get("verify") is None
    with pytest.raises(TcError, match=r"methods \['prefill', 'decode'\] and no 'forward'"):
        model(np.zeros((1, 1, 32), np.float32), np.array([0]))
    assert list(model.new_session().methods) == ["prefill", "decode"]


def test_a_guard_error_names_the_method():
    model = load(_package())
    with pytest.raises(StaticDimError, match=r"^method 'decode': input 'x_one' dim 1") as e:
        model.methods["decode"](np.zeros((1, 2, 32), np.float32), np.array([0, 1]))
    assert e.value.method == "decode"
    assert int(model.state()["steps"]) == 7  # refused before anything ran


def test_a_package_without_methods_has_forward_alone():
    from packages import mlp_package

    model = load(mlp_package())
    assert list(model.methods) == ["forward"] and model.methods["forward"] is model
    with pytest.raises(UnknownMethodError):
        model.methods["decode"]


def test_a_manifest_whose_method_state_disagrees_is_refused():
    raw = json.loads(open_archive(_package()).manifest_bytes)
    raw["methods"][1]["state"][0]["input"] = 0  # decode's k_cache paired with x_one: another dtype and shape
    with pytest.raises(FormatError, match=r"methods\[1\]|state\[0\]"):
        parse_manifest(raw)
    raw = json.loads(open_archive(_package()).manifest_bytes)
    raw["graphs"]["decode"]["cpu"]["entry"] = "tc_run"
    with pytest.raises(FormatError, match="tc_run_method_decode"):
        parse_manifest(raw)


@pytest.mark.parametrize("methods, kwargs, message", [
    ({"bad-name": {"example_inputs": (torch.zeros(1),)}}, {}, "should be a Python identifier"),
    ({"inference": {"example_inputs": (torch.zeros(1),)}}, {}, "is reserved"),
    ({"decode": {"example_inputs": (torch.zeros(1),), "function": "nope"}}, {}, "'nope' is not a method"),
    ({"decode": {"example_inputs": "x"}}, {}, "'example_inputs' should be a non-empty tuple of tensors"),
    ({"decode": {"inputs": ()}}, {}, "unknown key"),
    ({"decode": {"example_inputs": (torch.zeros(1, 1, 32), torch.tensor([0]))}}, dict(backward=True), "--backward"),
    ({"decode": {"example_inputs": (torch.zeros(1, 1, 32), torch.tensor([0]))}}, dict(onnx="file"), "--onnx"),
    ({"decode": {"example_inputs": (torch.zeros(1, 1, 32), torch.tensor([0]))}}, dict(precision="bf16"),
     "--precision"),
    ({"decode": {"example_inputs": (torch.zeros(1, 1, 32), torch.tensor([0]))}}, dict(dynamic=["prefill:seq"]),
     r"names method 'prefill'; the methods are \['decode'\]"),
])
def test_method_errors_say_what_was_expected(methods, kwargs, message):
    from tcexport.exporter.pipeline import export

    with pytest.raises(MethodError, match=message) as e:
        export(_eager(), methods=methods, **kwargs)
    assert e.value.exit_code == 18


def test_a_method_prefix_without_methods_is_a_method_error():
    from tcexport.exporter.pipeline import export

    module = load_module(MODELS / "kv_cache.py")
    with pytest.raises(MethodError, match="declares no methods"):
        export(module.model(), module.example_inputs(), dynamic=["decode:seq"])


def test_cli_exports_and_inspect_shows_the_methods(tmp_path):
    out = tmp_path / "kv.tcpkg"
    r = subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", str(KV), "-o", str(out), "--json",
                        "--dump", str(tmp_path / "dump")], capture_output=True, text=True,
                       env=dict(os.environ, TCEXPORT_CACHE=str(WORK / "cache")))
    doc = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(doc["methods"]) == ["prefill", "decode"] and doc["methods"]["prefill"]["symbols"] == {"seq": [1, 16]}
    assert doc["methods"]["prefill"]["kernels"] == doc["kernels"] and doc["methods"]["decode"]["kernels"]
    for name in ("prefill", "decode"):
        assert {"graph.txt", "ir.txt", "kernels.txt", "plan.txt"} <= {p.name for p in (tmp_path / "dump" / name).iterdir()}
    assert (tmp_path / "dump" / "model.cpp").is_file()
    r = subprocess.run([sys.executable, "-m", "tcexport.loader.cli", "inspect", str(out)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert "method prefill (graph inference; m.methods['prefill'])" in r.stdout
    assert "method decode (graph decode; m.methods['decode'])" in r.stdout and "input  x_one: float32[1, 1, 32]" in r.stdout
    r = subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", str(KV), "-o", str(tmp_path / "x.tcpkg"),
                        "--json", "--onnx"], capture_output=True, text=True)
    doc = json.loads(r.stdout)
    assert r.returncode == 18 and doc["error"]["type"] == "MethodError" and "--onnx" in doc["error"]["message"]
    r = subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", str(KV), "-o", str(tmp_path / "x.tcpkg"),
                        "--json", "--dynamic", "generate:seq"], capture_output=True, text=True)
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 18 and (err["method"], err["got"], err["expected"]) == ("generate", "generate",
                                                                                   ["prefill", "decode"])


def test_cli_verify_runs_the_methods_in_one_session_and_compares_the_state(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", str(KV), "-o", str(tmp_path / "kv.tcpkg"),
                        "--json", "--verify"], capture_output=True, text=True,
                       env=dict(os.environ, TCEXPORT_CACHE=str(WORK / "cache")))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(r.stdout)["verify"]
    labels = [c["case"] for c in report["cases"]]
    assert labels[:2] == ["prefill:example", "decode:example"], labels  # prefill fills what decode reads
    assert {x for x in labels if x.startswith("state:")} == {f"state:{s.name}" for s in
                                                             open_archive(tmp_path / "kv.tcpkg").manifest.state}
    assert report["ok"] and report["ran_on"] == "cpu" and report["torch_loaded_in_runner"] is False


def test_verify_with_methods_finds_a_package_that_differs_from_the_model():
    from tcexport.exporter.check.verify_methods import verify_methods
    from tcexport.exporter.front.model_file import load_model_file

    spec = load_model_file(str(KV))
    with torch.no_grad():
        next(spec.module.parameters()).add_(0.5)  # the model moved on after the package was built
    report = verify_methods(spec, _package(), quiet=True)
    assert not report["ok"]
    assert {c["case"].split(":")[0] for c in report["cases"] if not c["ok"]} >= {"prefill", "decode"}


def test_cli_report_names_the_method_an_op_blocks(tmp_path):
    path = MODELS / "methods_blocked.py"
    r = subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", str(path), "--report", "--json"],
                       capture_output=True, text=True)
    body = json.loads(r.stdout)
    assert r.returncode == 14, r.stderr[-2000:]
    line = next(k for k, text in enumerate(path.read_text().splitlines(), 1) if "unsupported in rank" in text)
    assert [(b["method"], b["op"], b["line"]) for b in body["blockers"]] == [("rank", "aten.sort.default", line)]


def _tcpkg_run(*args):
    return subprocess.run([sys.executable, "-m", "tcexport.loader.cli", "run", *map(str, args), "--json"],
                          capture_output=True, text=True)


def test_tcpkg_run_calls_a_method_and_writes_the_state_it_leaves(tmp_path):
    g = torch.Generator().manual_seed(7)
    x, pos = _token(g, 0)
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "pos.npy", pos.numpy())
    r = _tcpkg_run(_package(), "--method", "decode", "-i", f"x_one={tmp_path / 'x.npy'}",
                   "-i", f"pos_one={tmp_path / 'pos.npy'}", "-o", tmp_path / "out")
    assert r.returncode == 0, r.stdout + r.stderr
    body = json.loads(r.stdout)
    eager = _eager()
    want = _run(eager, "step", x, pos)
    assert body["method"] == "decode"
    np.testing.assert_allclose(np.load(body["outputs"][0]["file"]), want, rtol=1e-4, atol=1e-5)
    buffers = dict(eager.named_buffers())
    assert {s["name"] for s in body["state"]} == {f"state.{n}" for n in buffers}
    for s in body["state"]:
        np.testing.assert_allclose(np.load(s["file"]), buffers[s["name"][len("state."):]].numpy(), rtol=1e-4,
                                   atol=1e-5)


def test_tcpkg_run_an_unknown_method_is_a_usage_error_naming_it(tmp_path):
    r = _tcpkg_run(_package(), "--method", "generate", "-o", tmp_path)
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 2 and err["type"] == "UnknownMethodError"
    assert err["method"] == "generate" and err["expected"] == ["prefill", "decode"] and err["input"] is None


def test_cuda_cubins_build_for_every_method():
    m = open_archive(_package("cuda:sm_90")).manifest
    assert m.method_names() == ["prefill", "decode"]
    for graph in ("inference", "decode"):
        cubins = m.graphs[graph].cuda.cubins["sm_90"]
        assert cubins and all(c.file in m.members for c in cubins)
    assert all(c.file.startswith("kernels/cuda-sm_90/methods/decode/") for c in m.graphs["decode"].cuda.cubins["sm_90"])
    assert "src/cuda/methods/decode.py" in m.sources


def test_cuda_methods_in_the_interpreter():
    """Each method's launch list in Triton's interpreter, the state passed through as inputs and outputs, one
    after the other as the loader would run them on one session."""
    from tcexport.exporter.check.interpret import run_interpreted

    path, eager = _package("cuda:sm_90", build_cubins=False), _eager()
    g = torch.Generator().manual_seed(3)
    for name, fn, (x, pos) in (("prefill", "forward", _prompt(g)), ("decode", "step", _token(g, 3))):
        state = [getattr(eager, b).numpy().copy() for b in ("k_cache", "v_cache", "steps")]
        want = [_run(eager, fn, x, pos)] + [getattr(eager, b).numpy() for b in ("k_cache", "v_cache", "steps")]
        got = run_interpreted(path, [[x.numpy(), pos.numpy(), *state]], method=name)[0]
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@functools.lru_cache(maxsize=None)
def _lm_methods(kind: str):
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export

    saved = {k: os.environ.get(k) for k in ("TCEXPORT_LM", "TCEXPORT_LM_SIZE")}
    os.environ.update(TCEXPORT_LM=kind, TCEXPORT_LM_SIZE="small")
    try:
        spec = load_model_file(str(EXAMPLES / "lm_methods.py"))
        path = WORK / f"lm-methods-{kind}.tcpkg"
        export(spec.module, methods=spec.methods, name=kind, source_path=str(spec.path)).save(path)
        return path, load_module(EXAMPLES / "lm_cache.py")
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.parametrize("kind", ["gpt2", pytest.param("llama", marks=pytest.mark.long)])
def test_prefill_then_decode_equals_transformers_generate(kind):
    path, file = _lm_methods(kind)
    generate = load_module(EXAMPLES / "generate.py").generate
    prompt = [5, 6, 7, 8]
    with torch.no_grad():
        want = file.hf_model().generate(torch.tensor([prompt]), max_new_tokens=64,
                                        do_sample=False)[0, len(prompt):].tolist()
    model = load(path)
    assert list(model.methods) == ["prefill", "decode"]
    assert generate(model, prompt, 64, methods=True) == want
