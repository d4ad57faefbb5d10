"""tcexport as CI runs it, on a tiny model that prints: --json stdout stays one document, --meta and
--model-version reach the manifest and tcpkg inspect, a --dynamic typo is caught with "did you mean", a range from
the model file is never dropped, progress is passed as a value, and a package the loader refuses is never written.
One tiny model, built once in process (its kernels then come from the session's cache for the CLI runs)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from packages import WORK
from tcexport.exporter.errors import DynamicSpecError
from tcexport.exporter.front.dynamic import resolve
from tcexport.formats.errors import UnloadablePackageError

TINY = '''
import torch
print("model file says hello")            # module-level print: must not reach stdout under --json


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1, 1, 8))

    def forward(self, x):
        print("forward says hello")       # printed during capture
        return torch.relu(x * 2 + self.w)


def model():
    return Tiny()


def example_inputs():
    return (torch.randn(3, 8),)


dynamic_shapes = {"x": {0: ("batch", 1, 64)}}
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.py"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def tiny_package(tiny):
    """The tiny model exported in process (fills the kernel cache the CLI runs share), with a recording Progress."""
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export
    from tcexport.exporter.progress import Progress

    class Recorder(Progress):
        def __init__(self):
            self.events = []

        def stage(self, name, detail=""):
            self.events.append(("stage", name, detail))

        def step(self, done, total, what):
            self.events.append(("step", done, total, what))

    spec = load_model_file(tiny)
    rec = Recorder()
    pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, name="tiny", progress=rec,
                 model_version="3.1", metadata={"owner": "vision"})
    return pkg, rec.events


def tcexport(*args):
    return subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, "TCEXPORT_CACHE": str(WORK / "cache")})


def tcpkg(*args):
    return subprocess.run([sys.executable, "-m", "tcexport.loader.cli", *map(str, args)], capture_output=True,
                          text=True)


@pytest.mark.slow
def test_json_stdout_is_one_document_and_metadata_reaches_inspect(tiny, tiny_package, tmp_path):
    out = tmp_path / "tiny.tcpkg"
    r = tcexport(tiny, "-o", out, "--json", "--model-version", "2.0.1", "--meta", "git_sha=0a1b2c3",
                 "--meta", "owner=vision")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)   # the model's prints went to stderr
    assert doc["ok"] and doc["schema_version"] == 1 and doc["tool"] == "tcexport" and doc["command"] == "export"
    assert doc["model"] == {"name": "tiny", "version": "2.0.1", "metadata": {"git_sha": "0a1b2c3", "owner": "vision"}}
    assert "model file says hello" in r.stderr and "forward says hello" in r.stderr
    text = tcpkg("inspect", out, "--summary")
    assert text.returncode == 0, text.stderr
    assert "model:       tiny, version 2.0.1" in text.stdout and "metadata:    git_sha = 0a1b2c3" in text.stdout
    assert "parameters:  8 (8) in 1 tensors" in text.stdout
    full = json.loads(tcpkg("inspect", out, "--json").stdout)
    assert full["manifest"]["model"] == {"name": "tiny", "version": "2.0.1",
                                         "metadata": {"git_sha": "0a1b2c3", "owner": "vision"}}
    assert full["summary"]["model_version"] == "2.0.1"
    bad = tcexport(tiny, "-o", tmp_path / "x.tcpkg", "--json", "--meta", "bad key=1")
    assert bad.returncode == 2 and "--meta" in json.loads(bad.stdout)["error"]["message"]


@pytest.mark.slow
def test_dynamic_typo_and_dropped_range_are_errors(tiny, tmp_path):
    out = tmp_path / "x.tcpkg"
    r = tcexport(tiny, "--dynamic", "bacth", "-o", out, "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == DynamicSpecError.exit_code and doc["error"]["type"] == "DynamicSpecError"
    assert "did you mean 'batch'?" in doc["error"]["message"] and doc["error"]["symbol"] == "bacth"
    assert not out.exists()


def test_resolve_catches_typos_and_dropped_ranges():
    x = (torch.zeros(3, 8),)
    file_dyn = {"x": {0: ("batch", 1, 64)}}
    with pytest.raises(DynamicSpecError, match=r"did you mean 'batch'\?"):
        resolve(["x"], x, file_dyn, ["bacth=1:8"])
    with pytest.raises(DynamicSpecError, match=r"symbol 'batch' \(range 1\.\.64\).*drop that range"):
        resolve(["x"], x, file_dyn, ["n"])
    with pytest.raises(DynamicSpecError, match=r"did you mean 'x'\?"):
        resolve(["x"], x, file_dyn, ["seq@xx.1"])
    symbols, places = resolve(["x"], x, file_dyn, ["batch=1:8", "seq=1:16@x.1"])   # a new range, a new dim
    assert (symbols["batch"].max, places["x"]) == (8, {0: "batch", 1: "seq"})
    symbols, _ = resolve(["x"], x, None, ["n"])   # no model file spec: any name
    assert "n" in symbols


@pytest.mark.slow
def test_progress_is_a_value_through_the_pipeline(tiny_package):
    _, events = tiny_package
    stages = [e[1] for e in events if e[0] == "stage"]
    assert stages[:2] == ["capture", "lower"] and "build_cpp" in stages and stages[-1] == "package"
    assert ("stage", "build_cpp", "building 3 CPU bundles") in events
    steps = [e for e in events if e[0] == "step"]
    assert steps and steps[-1] == ("step", 3, 3, "CPU bundles")


@pytest.mark.slow
def test_a_package_the_loader_refuses_is_never_written(tiny_package, tmp_path):
    pkg, _ = tiny_package
    assert pkg.manifest.model_version == "3.1" and pkg.manifest.metadata == {"owner": "vision"}
    out = tmp_path / "tiny.tcpkg"
    out.write_bytes(b"the old package")
    # the weight's shape as the manifest states it differs from the bytes (the 0-d-stored-as-[1] kind of bug)
    w = pkg.manifest.weights[0]
    wrong = dataclasses.replace(pkg.manifest, weights=(dataclasses.replace(w, shape=(1, 8)),))
    broken = dataclasses.replace(pkg, manifest=wrong)
    with pytest.raises(UnloadablePackageError, match="its own loader refuses") as e:
        broken.save(out)
    assert e.value.exit_code == 3 and e.value.path == str(out)
    # a package whose call at the example inputs fails (here: inputs the guards refuse) is refused too
    odd = dataclasses.replace(pkg, check=None)
    from tcexport.exporter.package.selfcheck import example_call

    with pytest.raises(UnloadablePackageError, match="GuardError|SymbolRangeError|StaticDimError"):
        odd.save(out, check=example_call((torch.zeros(3, 9),)))
    assert out.read_bytes() == b"the old package" and os.listdir(tmp_path) == ["tiny.tcpkg"]
    pkg.save(out)   # the real one passes the same checks
    assert out.read_bytes()[:2] == b"PK"


@pytest.mark.slow
def test_unsupported_op_fields_in_json(tmp_path):
    from packages import MODELS

    r = tcexport(MODELS / "unsupported.py", "-o", tmp_path / "u.tcpkg", "--json")
    e = json.loads(r.stdout)["error"]
    assert r.returncode == 14 and e["type"] == "UnsupportedOpError" and e["op"] == "aten.sort.default"
    assert e["file"].endswith("unsupported.py") and e["line"] == 10
