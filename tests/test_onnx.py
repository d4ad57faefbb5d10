"""`--onnx`: the same model with the same dynamic dims as ONNX, run by ONNX Runtime at two shapes."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from packages import EXAMPLES, MODELS, load_module

pytestmark = pytest.mark.slow
ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("model_file, shapes", [
    (EXAMPLES / "mlp.py", [[(1, 64)], [(37, 64)]]),
    (MODELS / "attention.py", [[(1, 3, 16)], [(5, 40, 16)]]),
])
def test_onnx_matches_eager_at_two_shapes(tmp_path, model_file, shapes):
    out = tmp_path / "m.tcpkg"
    r = subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", str(model_file), "-o", str(out), "--onnx",
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    onnx_path = json.loads(r.stdout)["onnx"]
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    module = load_module(model_file).model().eval()
    for case in shapes:
        xs = [np.random.default_rng(3).standard_normal(s, dtype=np.float32) for s in case]
        got = session.run(None, dict(zip(names, xs)))[0]
        with torch.no_grad():
            want = module(*[torch.from_numpy(x) for x in xs]).numpy()
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
    with zipfile.ZipFile(out) as z:
        assert "model.onnx" not in z.namelist()  # --onnx writes a file beside the package only


def test_onnx_embed_is_recorded_and_deterministic(tmp_path):
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export
    from tcexport.loader.archive import open_archive

    paths = []
    for k in range(2):
        spec = load_model_file(EXAMPLES / "mlp.py")
        pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, name="mlp", onnx="embed")
        paths.append(pkg.save(tmp_path / f"m{k}.tcpkg"))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    archive = open_archive(paths[0])
    assert archive.manifest.onnx["file"] == "model.onnx" and archive.manifest.onnx["opset"] >= 17
    import onnx

    onnx.checker.check_model(onnx.load_from_string(archive.read("model.onnx")))


def test_onnx_keeps_the_fixes_capture_accepted(tmp_path):
    """A model that needs seq % 4 == 0: capture accepts torch's fix, and the ONNX export must use it too."""
    out = tmp_path / "d.tcpkg"
    r = subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", str(MODELS / "dyn_divisible.py"), "-o",
                        str(out), "--onnx", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    session = ort.InferenceSession(json.loads(r.stdout)["onnx"], providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    module = load_module(MODELS / "dyn_divisible.py")
    example = module.example_inputs()[0]
    for seq in (8, 12):
        x = np.random.default_rng(seq).standard_normal((2, seq, example.shape[2]), dtype=np.float32)
        with torch.no_grad():
            want = module.model().eval()(torch.from_numpy(x))
        want = want[0] if isinstance(want, tuple) else want
        np.testing.assert_allclose(session.run(None, {name: x})[0], want.numpy(), atol=2e-5, rtol=1e-4)
