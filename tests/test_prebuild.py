"""exporter/prebuild.py, CI's prebuild job: a model list built in parallel worker processes into one summary; one
failure does not stop the others; the packages are signed; a second runner (warm kernel cache) writes identical
bytes; and examples/ci/prebuild.yml's steps are the ones run here."""

from __future__ import annotations

import pytest

from tcexport.exporter.errors import ExportError
from tcexport.exporter.prebuild import BuildItem, prebuild, read_list
from packages import EXAMPLES, ROOT

pytestmark = pytest.mark.slow


def _keys(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private, public = tmp_path / "sign.pem", tmp_path / "sign.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def test_list_file_lines_and_their_errors(tmp_path):
    models = tmp_path / "models.txt"
    models.write_text("# the fleet's models\nmlp.py --target cpu,cuda:sm_90 --dynamic batch=1:64\n\n"
                      "/abs/cnn.py -o cnn-fast.tcpkg --precision bf16  # a comment\n")
    a, b = read_list(models)
    assert a == BuildItem(str(tmp_path / "mlp.py"), "cpu,cuda:sm_90", ("batch=1:64",))
    assert b == BuildItem("/abs/cnn.py", "cpu", (), "cnn-fast.tcpkg", "bf16")
    models.write_text("mlp.py --jobs 2\n")
    with pytest.raises(ExportError, match="line 1: '--jobs' is not an option"):
        read_list(models)
    models.write_text("# nothing\n")
    with pytest.raises(ExportError, match="names no model"):
        read_list(models)
    with pytest.raises(ExportError, match="both write"):
        prebuild([BuildItem("a/m.py"), BuildItem("b/m.py")], tmp_path / "out")
    with pytest.raises(ExportError, match="--jobs"):
        prebuild([BuildItem("m.py")], tmp_path / "out", jobs=0)


def test_two_runners_build_signed_identical_packages_and_a_failure_stays_its_own(tmp_path):
    import tcexport.loader as L

    pytest.importorskip("triton")
    private, public = _keys(tmp_path)
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\ndef model():\n    return torch.nn.Linear(4, 4)\n")  # no example_inputs
    models = tmp_path / "models.txt"
    models.write_text(f"{EXAMPLES / 'mlp.py'} --target cpu\n{EXAMPLES / 'mlp.py'} --target cuda:sm_90 "
                      f"-o mlp-sm90.tcpkg\n{broken}\n")
    seen = []
    first = prebuild(read_list(models), tmp_path / "runner1", jobs=2, cache_dir=tmp_path / "cache",
                     sign_key=private, on_item=lambda r: seen.append(r.model))
    assert not first["ok"] and first["built"] == 2 and first["failed"] == 1 and len(seen) == 3
    rows = {p["package"].rsplit("/", 1)[1]: p for p in first["packages"]}  # several target sets: -<targets>
    assert sorted(rows) == ["broken-cpu.tcpkg", "mlp-cpu.tcpkg", "mlp-sm90.tcpkg"]
    assert rows["broken-cpu.tcpkg"]["error"] == "ModelFileError" and rows["broken-cpu.tcpkg"]["exit_code"] == 11
    assert not (tmp_path / "runner1" / "broken-cpu.tcpkg").exists()
    assert rows["mlp-cpu.tcpkg"]["signed"] and rows["mlp-sm90.tcpkg"]["ok"]
    L.load(tmp_path / "runner1" / "mlp-cpu.tcpkg", trusted_keys=[public])  # the signature verifies

    # the second runner: a warm cache (the CI cache restored), one worker; the same bytes
    second = prebuild(read_list(models)[:2], tmp_path / "runner2", jobs=1, cache_dir=tmp_path / "cache",
                      sign_key=private)
    assert second["ok"]
    for name in ("mlp-cpu.tcpkg", "mlp-sm90.tcpkg"):
        assert (tmp_path / "runner1" / name).read_bytes() == (tmp_path / "runner2" / name).read_bytes(), name


def test_the_example_workflow_names_the_steps_tested_here():
    text = (ROOT / "examples" / "ci" / "prebuild.yml").read_text()
    for step in ("--models examples/ci/models.txt", "--jobs", "TCEXPORT_CACHE", "--sign-key", "cmp ",
                 "actions/cache"):
        assert step in text, step
    items = read_list(ROOT / "examples" / "ci" / "models.txt")
    assert {i.targets for i in items} == {"cpu", "cuda:sm_80,sm_90"}
    assert all(i.output_path(ROOT, True).name.endswith(".tcpkg") and __import__("os").path.isfile(i.model)
               for i in items)


def test_cli_builds_several_files_into_one_json_summary(tmp_path):
    import json
    import subprocess
    import sys

    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\ndef model():\n    return torch.nn.Linear(4, 4)\n")
    out = subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", str(EXAMPLES / "mlp.py"), str(broken),
                          "-o", str(tmp_path / "dist"), "--jobs", "2", "--json"], capture_output=True, text=True,
                         timeout=600)
    doc = json.loads(out.stdout)  # exactly one JSON document on stdout
    assert doc["schema_version"] == 1 and doc["command"] == "prebuild"
    assert (doc["built"], doc["failed"]) == (1, 1) and out.returncode == doc["exit_code"] == 11
    assert (tmp_path / "dist" / "mlp.tcpkg").is_file()
