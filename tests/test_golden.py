"""Golden packages: the current loader loads and runs a package built by every earlier format version (SPEC §8).

tests/golden/v1_<minor>.tcpkg were each built by the last commit writing that format version
(tests/golden/build_golden.py, which also wrote expected.json: the commit, the input and eager PyTorch's output).
This file imports neither torch nor the exporter.
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import numpy as np
import pytest

import tcexport.loader as L
from tcexport.formats.manifest import FORMAT_VERSION

GOLDEN = Path(__file__).resolve().parent / "golden"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())
PACKAGES = EXPECTED["packages"]

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the golden packages hold x86-64 kernel libraries only")


def formula_input(batch: int, width: int) -> np.ndarray:
    """tiny_model.check_input: x[i][j] = ((i * width + j) % 17 - 8) / 8."""
    i, j = np.indices((batch, width))
    return (((i * width + j) % 17 - 8) / 8).astype(np.float32)


def test_every_older_minor_version_has_a_golden_package():
    versions = {tuple(e["format_version"]) for e in PACKAGES.values()}
    major, minor = FORMAT_VERSION
    assert {(major, m) for m in range(minor)} <= versions, f"golden packages cover {sorted(versions)}"


@pytest.mark.parametrize("name", list(PACKAGES))
def test_golden_package_runs(name, tmp_path):
    entry = PACKAGES[name]
    path = GOLDEN / name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], (
        f"{name} is not the file expected.json describes (rebuild both with tests/golden/build_golden.py)")
    x = np.asarray(entry["input"], dtype=np.float32)
    np.testing.assert_array_equal(x, formula_input(*x.shape))
    want = np.asarray(entry["output"], dtype=np.float32)
    assert x.shape == tuple(entry["input_shape"]) and want.shape == tuple(entry["output_shape"])

    for isa in (None, "x86-64"):  # the bundle this CPU picks, and the baseline one
        model = L.load(path, isa=isa, cache_dir=tmp_path)
        assert list(model.manifest.format_version) == entry["format_version"]
        got = model(x)
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=EXPECTED["rtol"], atol=EXPECTED["atol"],
                                   err_msg=f"{name} (format {entry['format_version']}, isa {isa})")
        for batch in (1, 64):  # the dynamic batch's ends (the package was exported at batch 3)
            out = model(formula_input(batch, x.shape[1]))
            assert out.shape == (batch, want.shape[1])
            assert np.all(np.isfinite(out))
        # the stored rows again, as the first rows of a batch of 64 (the formula depends on the row, not the batch)
        np.testing.assert_allclose(model(formula_input(64, x.shape[1]))[: len(x)], want,
                                   rtol=EXPECTED["rtol"], atol=EXPECTED["atol"])


def test_the_previous_minor_version_loads_the_current_package(tmp_path):
    """The other half of SPEC §8: a loader of the previous minor version (its code taken from git history) loads a
    package of the current version. The attestation is the archive comment precisely so that this holds."""
    import shutil
    import subprocess
    import sys

    major, minor = FORMAT_VERSION
    current = next((n for n, e in PACKAGES.items() if e["format_version"] == [major, minor]), None)
    previous = next((e for e in PACKAGES.values() if e["format_version"] == [major, minor - 1]), None)
    repo = GOLDEN.parent.parent
    if current is None or previous is None or shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("needs the current version's golden package and the repository's history")
    src = tmp_path / "src"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(repo), "archive", previous["commit"], "loader", "formats"],
                             capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {previous['commit'][:12]} is not in this checkout's history")
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    ns = tmp_path / "ns" / "tcexport"
    ns.mkdir(parents=True)
    for folder in ("loader", "formats"):
        (ns / folder).symlink_to(src / folder)
    x = np.asarray(PACKAGES[current]["input"], dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    code = f"""
import numpy as np, tcexport.loader as L
assert L.__file__.startswith({str(tmp_path)!r}), L.__file__
m = L.load({str(GOLDEN / current)!r}, cache_dir={str(tmp_path / 'cache')!r})
np.save({str(tmp_path / 'y.npy')!r}, m(np.load({str(tmp_path / 'x.npy')!r})))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHONPATH": str(tmp_path / "ns"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    if len(L.open_archive(GOLDEN / current).manifest.methods) > 1:
        # a CPU package with methods (1.10): the previous loader refuses it cleanly (SPEC §8), never runs it wrongly
        assert r.returncode != 0 and "FormatError" in r.stderr and "upgrade tcexport" in r.stderr, r.stderr[-3000:]
        return
    assert r.returncode == 0, r.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), np.asarray(PACKAGES[current]["output"], np.float32),
                               rtol=EXPECTED["rtol"], atol=EXPECTED["atol"])


def test_signed_golden_package_verifies():
    """A 1.7 package signed today (with a test key kept beside it: never trust it for anything else) keeps
    verifying: the attestation's layout and the signed bytes are pinned."""
    pytest.importorskip("cryptography")
    from tcexport.formats.errors import SignatureError

    signed, plain = GOLDEN / "v1_7.signed.tcpkg", GOLDEN / "v1_7.tcpkg"
    key = GOLDEN / "test-signing-key.pub.pem"
    model = L.load(signed, trusted_keys=[key])
    entry = PACKAGES["v1_7.tcpkg"]
    np.testing.assert_allclose(model(np.asarray(entry["input"], np.float32)), np.asarray(entry["output"], np.float32),
                               rtol=EXPECTED["rtol"], atol=EXPECTED["atol"])
    assert model.archive.manifest_bytes == L.open_archive(plain).manifest_bytes
    with pytest.raises(SignatureError):
        L.load(plain, trusted_keys=[key])


def test_golden_methods_share_the_weights_and_the_state(tmp_path):
    """The 1.10 package (tiny_methods_model.py): ``forward`` (what a plain call runs) and ``one`` (a single row)
    read one weights file and add to one call counter."""
    entry = PACKAGES["v1_10.tcpkg"]
    model = L.load(GOLDEN / "v1_10.tcpkg", cache_dir=tmp_path)
    assert list(model.methods) == ["forward", "one"]
    x, want = np.asarray(entry["input"], np.float32), np.asarray(entry["output"], np.float32)
    np.testing.assert_allclose(model.methods["one"](x[:1]), want[:1], rtol=EXPECTED["rtol"], atol=EXPECTED["atol"])
    np.testing.assert_allclose(model(x), want, rtol=EXPECTED["rtol"], atol=EXPECTED["atol"])
    assert int(model.state()["calls"]) == 2
