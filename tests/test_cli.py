"""The `tcexport` and `tcpkg` command lines, as CI would call them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from packages import EXAMPLES, MODELS, WORK

pytestmark = pytest.mark.slow


def tcexport(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def tcpkg(*args):
    return subprocess.run([sys.executable, "-m", "tcexport.loader.cli", *map(str, args)], capture_output=True, text=True)


def test_export_json_dump_and_verify(tmp_path):
    out = tmp_path / "mlp.tcpkg"
    dump = tmp_path / "dump"
    r = tcexport(EXAMPLES / "mlp.py", "-o", out, "--json", "--dump", dump, "--verify")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["ok"] and summary["package"] == str(out) and summary["bytes"] == out.stat().st_size
    assert summary["symbols"] == {"batch": [1, 1024]} and len(summary["kernels"]) == 4
    assert summary["verify"]["ok"] and summary["verify"]["torch_loaded_in_runner"] is False
    assert {c["case"] for c in summary["verify"]["cases"]} == {"example", "batch=1", "batch=1024"}
    for name in ("graph.txt", "ir.txt", "kernels.txt", "plan.txt", "model.cpp", "build.txt"):
        assert (dump / name).stat().st_size > 0, name
    assert "tc_run" in (dump / "model.cpp").read_text()


def test_verify_bfloat16_model(tmp_path):
    """A bfloat16 model: inputs cross to the torch-free runner as tagged uint16 bits, outputs are compared as
    bfloat16 (within its tolerance), at the example and at both ends of the batch range."""
    r = tcexport(MODELS / "mlp_bf16.py", "-o", tmp_path / "bf16.tcpkg", "--json", "--verify")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)["verify"]
    assert report["ok"] and report["torch_loaded_in_runner"] is False
    assert [(c["case"], c["dtype"], c["shape"]) for c in report["cases"]] == [
        ("example", "bfloat16", [8, 32]), ("batch=1", "bfloat16", [1, 32]), ("batch=1024", "bfloat16", [1024, 32])]
    assert all(0 < v < 1 for v in report["cases"][0]["sample"])   # softmax values, not raw uint16 bits


def test_verify_half_comparison_rules():
    """16-bit floats: within torch.testing's tolerance of eager, or as close to float64 as eager is; a result
    far from both fails; a dtype without a tolerance (int64) compares exactly."""
    from tcexport.exporter.check.verify import _compare
    from tcexport.loader.dtypes import BFLOAT16

    def bf16(values):   # float32 -> bfloat16 bits (truncation is exact for these values)
        return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16).view(BFLOAT16)

    want = bf16([1.0, 0.5])
    assert _compare("c", 0, [], bf16([1.0078125, 0.5]), want, lambda: None)["ok"]    # 1 ulp: rtol 1.6e-2
    assert not _compare("c", 0, [], bf16([1.5, 0.5]), want, lambda: None)["ok"]
    ref = [np.array([1.40625, 0.5])]   # eager is far from the true value: the package may be as far
    assert _compare("c", 0, [], bf16([1.5, 0.5]), want, lambda: ref)["ok"]
    f16 = np.array([1.0, 2.0], np.float16)
    assert not _compare("c", 0, [], f16 + np.float16(0.01), f16, lambda: None)["ok"]   # rtol 1e-3
    assert _compare("c", 0, [], np.array([3], np.int64), np.array([3], np.int64), lambda: None)["ok"]
    assert not _compare("c", 0, [], np.array([3], np.int64), np.array([4], np.int64), lambda: None)["ok"]


def test_dynamic_flag_overrides_and_progress(tmp_path):
    model = tmp_path / "m.py"
    model.write_text((MODELS / "attention.py").read_text().replace("dynamic_shapes =", "_unused ="))
    r = tcexport(model, "--dynamic", "batch=1:8", "--dynamic", "seq=1:32@x.1", "-o", tmp_path / "a.tcpkg")
    assert r.returncode == 0, r.stderr
    assert "capture" in r.stderr and "build" in r.stderr  # progress on stderr
    info = json.loads(tcpkg("inspect", tmp_path / "a.tcpkg", "--json").stdout)
    assert [(s["name"], s["min"], s["max"]) for s in info["manifest"]["symbols"]] == [("batch", 1, 8), ("seq", 1, 32)]


@pytest.mark.parametrize("source, code", [
    ("x = 1\n", 11),
    (None, 14),
])
def test_exit_codes(tmp_path, source, code):
    path = MODELS / "unsupported.py" if source is None else tmp_path / "bad.py"
    if source is not None:
        path.write_text(source)
    r = tcexport(path, "-o", tmp_path / "x.tcpkg", "--json")
    assert r.returncode == code, (r.returncode, r.stderr)
    body = json.loads(r.stdout)
    assert body["ok"] is False and body["exit_code"] == code
    assert not (tmp_path / "x.tcpkg").exists()


def test_bad_dynamic_spec_exit_code(tmp_path):
    r = tcexport(EXAMPLES / "mlp.py", "--dynamic", "batch=9:3", "-o", tmp_path / "x.tcpkg")
    assert r.returncode == 12 and "empty" in r.stderr


def test_tcpkg_inspect_and_run(tmp_path):
    pkg = tmp_path / "mlp.tcpkg"
    assert tcexport(EXAMPLES / "mlp.py", "-o", pkg, "-q").returncode == 0
    text = tcpkg("inspect", pkg)
    assert text.returncode == 0 and "batch: 1..1024" in text.stdout and "sha256" in text.stdout
    x = np.random.default_rng(0).standard_normal((6, 64), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    r = tcpkg("run", pkg, "--input", f"x={tmp_path / 'x.npy'}", "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    y = np.load(tmp_path / "out" / "output.npy")
    assert y.shape == (6, 32) and np.allclose(y.sum(axis=1), 1, atol=1e-5)
    np.save(tmp_path / "bad.npy", x[:, :10])
    bad = tcpkg("run", pkg, "--input", f"x={tmp_path / 'bad.npy'}")
    assert bad.returncode == 5 and "dim 1" in bad.stderr


def test_tuning_flags(tmp_path):
    """--autotune needs a GPU and says so before anything is built; --tuning takes a tuned package's choice."""
    out = tmp_path / "x.tcpkg"
    r = tcexport(EXAMPLES / "mlp.py", "--target", "cuda:sm_90", "--autotune-at", "batch=2", "-o", out)
    assert r.returncode == 10 and "add --autotune" in r.stderr
    r = tcexport(EXAMPLES / "mlp.py", "--autotune", "-o", out)
    assert r.returncode == 10 and "add a cuda target" in r.stderr
    r = tcexport(EXAMPLES / "mlp.py", "--target", "cuda:sm_90", "--tuning", EXAMPLES / "mlp.py", "-o", out)
    assert r.returncode == 3 and "mlp.py" in r.stderr  # not a package: the archive reader's FormatError
    import torch

    if not torch.cuda.is_available():
        r = tcexport(EXAMPLES / "mlp.py", "--target", "cuda:sm_90", "--autotune", "-o", out)
        assert r.returncode == 10 and "torch sees no CUDA device" in r.stderr and "capture" not in r.stderr
    assert not out.exists()
