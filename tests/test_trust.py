"""A package a server can trust: every byte covered, signatures, the manifest unable to steer native calls.

Each test here fails without its fix: a manifest edit that the loader used to follow (a library path, an entry
point, the workspace, output shapes, the weight order), a rehashed substitution, the signature matrix, and the
kernel cache's races (tests/test_kernel_cache.py has the cache, tests/test_lifetime.py truncation and fork).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from loader_helpers import (ADD_KERNEL_C, KERNEL_FILE, WEIGHTS, build_package, compile_c, compile_kernel,
                            default_members, descriptor_c, make_manifest, read_comment, read_entries, rewrite,
                            spec)
from tcexport.formats import attestation as att
from tcexport.formats.errors import FormatError, IntegrityError, SignatureError, TcError
from tcexport.formats.manifest import Symbol
from tcexport.loader import load
from tcexport.loader.archive import open_archive
from tcexport.packager.archive import write_archive

pytest.importorskip("cryptography")
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

X = np.arange(12, dtype=np.float32).reshape(3, 4)


def _keys(tmp_path, name):
    """An ed25519 key pair as PEM files (what `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout`
    write), from cryptography so the test needs no openssl."""
    key = Ed25519PrivateKey.generate()
    private = tmp_path / f"{name}.pem"
    public = tmp_path / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _signed(package, tmp_path, *keys, name="signed.tcpkg"):
    from tcexport.loader.signing import sign_package

    out = tmp_path / name
    shutil.copy(package, out)
    for key in keys:
        sign_package(out, key)
    return out


# -- 1. everything is covered --------------------------------------------------------------------------------


def test_package_digest_is_the_manifest_sha256(package):
    archive = open_archive(package)
    entries = dict(read_entries(package))
    assert archive.digest == att.package_digest(entries["manifest.json"])
    assert archive.attestation.signatures == ()


@pytest.mark.parametrize("field", ["libraries", "entry", "workspace", "output shape", "weight order", "range",
                                   "guard", "dtype"])
def test_manifest_only_edit_is_an_integrity_error(tmp_path, field):
    """Without re-hashing, any edit of the manifest is caught by the package digest before it is parsed."""
    edited = rewrite(_two_weights(tmp_path), tmp_path / "e.tcpkg", EDITS[field], rehash=False)
    with pytest.raises(IntegrityError, match="manifest.json has SHA-256 .* package digest"):
        load(edited)


def _two_weights(tmp_path):
    """A kernel with two weights, so that their order can be swapped: y = x + w + v."""
    m = make_manifest(weights=(spec("v", "float32", [4]), spec("w", "float32", [4])))
    source = ADD_KERNEL_C.replace("w[j]", "w[j] + ((const float*)weights[1])[j]") + descriptor_c(m)
    from safetensors.numpy import save
    members = {"weights.safetensors": save({"v": np.zeros(4, np.float32), "w": WEIGHTS["w"]}),
               "src/add.c": b"", KERNEL_FILE: compile_c(tmp_path, source, "two", "-DABI=1")}
    return build_package(tmp_path / "two.tcpkg", m, members)


EDITS = {
    "libraries": lambda m: m["kernels"][0].update(libraries=["/tmp/evil.so"]),
    "entry": lambda m: m["kernels"][0].update(entry="abort"),
    "workspace": lambda m: (m["plan"].pop("workspace_bytes"), m["graphs"]["inference"]["cpu"].pop("workspace_bytes")),
    "output shape": lambda m: m["outputs"][0]["shape"].__setitem__(0, 1),
    "weight order": lambda m: m["weights"]["tensors"].reverse(),
    "range": lambda m: m["symbols"][0].update(max=1 << 40),
    "guard": lambda m: m["guards"].append({"expr": ["==", ["%", "batch", 2], 0], "message": "even"}),
    "dtype": lambda m: m["weights"]["tensors"][0].update(dtype="int32"),
}
REHASHED = {  # what a manifest edit with every hash recomputed meets
    "libraries": "may only need the system libraries",
    "entry": "entry point is fixed by the ABI",
    "workspace": "about 'workspace_bytes'",
    "output shape": "about 'outputs'",
    "weight order": "about 'weights'",
    "range": "about 'symbols'",
    "guard": "about 'guards'",
    "dtype": "weight 'v' is float32",
}


@pytest.mark.parametrize("field", sorted(EDITS))
def test_rehashed_manifest_edit_cannot_steer_the_kernels(tmp_path, field):
    """With every hash recomputed, the edit is refused by the allow-list, the fixed entry point or the interface
    descriptor compiled into the library, before any kernel runs: never a dlopen of another path, a call into
    libc, a NULL or short workspace, short outputs or swapped weights."""
    original = _two_weights(tmp_path)
    np.testing.assert_array_equal(load(original)(X), X + WEIGHTS["w"])
    edited = rewrite(original, tmp_path / "e.tcpkg", EDITS[field], rehash=True)
    with pytest.raises(FormatError, match=REHASHED[field]):
        load(edited)(X)


def test_library_built_for_another_interface_is_refused(package, tmp_path):
    """A library substituted (and rehashed) from a package with another interface: the descriptor disagrees."""
    other = make_manifest(symbols=(Symbol("batch", 1, 8),))
    lib = compile_kernel(tmp_path, manifest=other)
    swapped = rewrite(package, tmp_path / "s.tcpkg", members={KERNEL_FILE: lib})
    with pytest.raises(FormatError, match="about 'symbols'"):
        load(swapped)


def test_format_1_7_library_without_descriptor_is_refused(tmp_path):
    bare = compile_kernel(tmp_path, descriptor=False)
    p = build_package(tmp_path / "bare.tcpkg", members=default_members(bare))
    with pytest.raises(FormatError, match="has no tc_abi_descriptor"):
        load(p)


def test_downgraded_version_still_checks_the_descriptor(package, tmp_path):
    """Claiming an older format does not skip the check: a library that carries a descriptor is always checked."""
    def edit(m):
        m["format_version"] = [1, 6]
        m["outputs"][0]["shape"][0] = 1
    edited = rewrite(package, tmp_path / "old.tcpkg", edit)
    with pytest.raises(FormatError, match="about 'outputs'"):
        load(edited)


def test_missing_attestation_in_a_1_7_package(package, tmp_path):
    from tcexport.formats.container import write_container
    with open(tmp_path / "n.tcpkg", "wb") as f:
        write_container(f, read_entries(package))  # no archive comment
    with pytest.raises(IntegrityError, match="must carry an attestation"):
        load(tmp_path / "n.tcpkg")


def test_a_1_6_reader_sees_a_1_7_package_as_a_plain_zip(package):
    """The attestation is the archive comment, not a member: zipfile (and a 1.6 loader, which used it) sees the
    same members and manifest as before, so a 1.7 package stays readable by 1.x loaders (SPEC §8)."""
    import zipfile
    with zipfile.ZipFile(package) as z:
        assert z.testzip() is None and "attestation.json" not in z.namelist()
        assert json.loads(z.comment)["payloadType"] == att.PAYLOAD_TYPE


def test_manifest_crc_is_checked(package, tmp_path):
    raw = bytearray(package.read_bytes())
    at = raw.find(b'"add"')
    raw[at + 1] ^= 0x20  # "Add": a flipped bit the zip CRC catches before any parsing
    (tmp_path / "c.tcpkg").write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match="CRC-32"):
        load(tmp_path / "c.tcpkg")


# -- 2. signatures ---------------------------------------------------------------------------------------------


def test_signing_changes_only_the_attestation(package, tmp_path):
    a, _ = _keys(tmp_path, "a")
    signed = _signed(package, tmp_path, a)
    before, after = read_entries(package), read_entries(signed)
    assert before == after  # every member, the manifest included, is byte-identical
    assert read_comment(package) != read_comment(signed)
    # and so is every byte before the end record's comment length
    assert package.read_bytes()[:-len(read_comment(package)) - 2] == \
        signed.read_bytes()[:-len(read_comment(signed)) - 2]
    again = _signed(package, tmp_path, a, name="again.tcpkg")
    assert again.read_bytes() == signed.read_bytes()  # ed25519 is deterministic: same key, same bytes


def test_signature_matrix(package, tmp_path):
    """Every combination of how a package is signed and which keys a loader trusts."""
    a, a_pub = _keys(tmp_path, "a")
    b, b_pub = _keys(tmp_path, "b")
    _, c_pub = _keys(tmp_path, "c")
    packages = {
        "unsigned": package,
        "A": _signed(package, tmp_path, a, name="A.tcpkg"),
        "B": _signed(package, tmp_path, b, name="B.tcpkg"),
        "A+B": _signed(package, tmp_path, a, b, name="AB.tcpkg"),
    }
    packages["A, member altered and rehashed"] = rewrite(packages["A"], tmp_path / "A-alt.tcpkg", rehash=True,
                                                         members={"src/add.c": b"changed"})
    packages["A, member altered"] = rewrite(packages["A"], tmp_path / "A-alt2.tcpkg", rehash=False,
                                            members={"src/add.c": b"changed"})
    packages["A, manifest edited"] = rewrite(packages["A"], tmp_path / "A-man.tcpkg", rehash=False,
                                             edit=lambda m: m["model"].update(name="evil"))
    trust = {"none": None, "A": [a_pub], "B": [b_pub], "A,B": [a_pub, b_pub], "C": [c_pub],
             "A (private key file)": [a]}
    ok_under = {  # package -> the trust settings it loads under
        "unsigned": {"none"},
        "A": {"none", "A", "A,B", "A (private key file)"},
        "B": {"none", "B", "A,B"},
        "A+B": {"none", "A", "B", "A,B", "A (private key file)"},
        "A, member altered and rehashed": {"none"},
        "A, member altered": set(),
        "A, manifest edited": set(),
    }
    for pname, path in packages.items():
        for tname, keys in trust.items():
            if tname in ok_under[pname]:
                np.testing.assert_array_equal(load(path, trusted_keys=keys)(X), X + WEIGHTS["w"])
            else:
                error = SignatureError if keys is not None else IntegrityError
                with pytest.raises(error):
                    load(path, trusted_keys=keys)
    archive = open_archive(packages["A+B"], trusted_keys=[b_pub])
    assert archive.signed_by == (att.keyid(att.load_public_key(b_pub)),)


def test_trusted_keys_from_the_environment(package, tmp_path, monkeypatch):
    a, a_pub = _keys(tmp_path, "a")
    _, b_pub = _keys(tmp_path, "b")
    signed = _signed(package, tmp_path, a)
    monkeypatch.setenv("TCEXPORT_TRUSTED_KEYS", os.pathsep.join([str(b_pub), str(a_pub)]))
    load(signed)
    with pytest.raises(SignatureError, match="unsigned"):
        load(package)
    monkeypatch.setenv("TCEXPORT_TRUSTED_KEYS", str(b_pub))
    with pytest.raises(SignatureError, match="none of them a trusted key"):
        load(signed)
    monkeypatch.setenv("TCEXPORT_TRUSTED_KEYS", "")
    with pytest.raises(SignatureError, match="names no key"):
        load(signed)
    monkeypatch.setenv("TCEXPORT_TRUSTED_KEYS", str(tmp_path / "missing.pem"))
    with pytest.raises(SignatureError, match="cannot read trusted key"):
        load(signed)


def test_packages_before_signatures_are_refused_when_keys_are_trusted(tmp_path):
    from pathlib import Path
    golden = Path(__file__).resolve().parent / "golden" / "v1_6.tcpkg"
    _, a_pub = _keys(tmp_path, "a")
    load(golden, cache_dir=tmp_path / "c")  # still valid without trusted keys (SPEC §8)
    with pytest.raises(SignatureError, match="unsigned"):
        load(golden, trusted_keys=[a_pub])


def test_trusted_mode_turns_structure_errors_into_signature_errors(package, tmp_path):
    _, a_pub = _keys(tmp_path, "a")
    raw = package.read_bytes()
    (tmp_path / "t.tcpkg").write_bytes(raw[:len(raw) // 2])
    with pytest.raises(SignatureError, match="cannot be verified"):
        load(tmp_path / "t.tcpkg", trusted_keys=[a_pub])


def test_keys_from_openssl(package, tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl on this machine")
    key, pub = tmp_path / "k.pem", tmp_path / "k.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True)
    signed = _signed(package, tmp_path, key)
    load(signed, trusted_keys=[pub])
    load(signed, trusted_keys=pub.read_bytes())


def test_wrong_key_kinds_are_signature_errors(tmp_path):
    (tmp_path / "junk.pem").write_text("-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")
    with pytest.raises(SignatureError, match="not an ed25519 public key"):
        att.trusted_keys([tmp_path / "junk.pem"])
    with pytest.raises(SignatureError, match="none was given"):
        att.trusted_keys([])
    from cryptography.hazmat.primitives.asymmetric import ec
    ec_key = ec.generate_private_key(ec.SECP256R1())
    pem = ec_key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(SignatureError, match="packages are signed with ed25519"):
        att.trusted_keys([pem])


def _tcpkg(*args, env=None):
    return subprocess.run([sys.executable, "-c",
                           "import sys; from tcexport.loader.cli import main; sys.exit(main())", *args],
                          capture_output=True, text=True, env=env)


def test_cli_sign_and_verify(package, tmp_path):
    a, a_pub = _keys(tmp_path, "a")
    _, b_pub = _keys(tmp_path, "b")
    copy = tmp_path / "p.tcpkg"
    shutil.copy(package, copy)
    r = _tcpkg("verify", str(copy), "--trusted-key", str(a_pub), "--json")
    assert r.returncode == SignatureError.exit_code and json.loads(r.stdout)["error"]["type"] == "SignatureError"
    r = _tcpkg("sign", str(copy), "--key", str(a), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["keyid"] == att.keyid(att.load_public_key(a_pub))
    r = _tcpkg("verify", str(copy), "--trusted-key", str(a_pub), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["verified"] and report["signed_by"] == [att.keyid(att.load_public_key(a_pub))]
    assert _tcpkg("verify", str(copy), "--trusted-key", str(b_pub)).returncode == SignatureError.exit_code
    env = {k: v for k, v in os.environ.items() if k != "TCEXPORT_TRUSTED_KEYS"}
    assert _tcpkg("verify", str(copy), env=env).returncode == 2  # no key: a usage error, never a pass
    out = tmp_path / "out.tcpkg"
    assert _tcpkg("sign", str(package), "--key", str(a), "-o", str(out)).returncode == 0
    assert out.read_bytes() == copy.read_bytes()
    r = _tcpkg("inspect", str(copy))
    assert r.returncode == 0 and att.keyid(att.load_public_key(a_pub)) in r.stdout and "package digest" in r.stdout


def test_signing_refuses_a_damaged_package(package, tmp_path):
    a, _ = _keys(tmp_path, "a")
    damaged = rewrite(package, tmp_path / "d.tcpkg", rehash=False, members={"src/add.c": b"x"})
    before = damaged.read_bytes()
    with pytest.raises(IntegrityError):
        _signed(damaged, tmp_path, a, name="d2.tcpkg")
    assert damaged.read_bytes() == before


def test_write_archive_signs(tmp_path, kernel):
    a, a_pub = _keys(tmp_path, "a")
    p = write_archive(tmp_path / "w.tcpkg", make_manifest(), default_members(kernel), sign_key=a)
    assert load(p, trusted_keys=[a_pub])(X).shape == (3, 4)


# -- 6. the closed error set for what the loader evaluates ------------------------------------------------------


def test_expression_values_are_bounded():
    from tcexport.formats import expr as ex
    big = ["*"] + [1 << 40] * 10
    with pytest.raises(FormatError, match="64 signed bits"):
        ex.evaluate(big, {})
    with pytest.raises(FormatError, match="64 signed bits"):
        ex.compile_expr(big)({})
    with pytest.raises(FormatError, match="64 signed bits"):
        ex.validate(1 << 64)
    nested = 2
    for _ in range(60):
        nested = ["*", nested, nested]  # 2^(2^60) if nothing stopped it
    with pytest.raises(FormatError, match="64 signed bits"):
        ex.evaluate(nested, {})


def test_max_workspace_bytes(package):
    model = load(package, max_workspace_bytes=16 * 3)
    model(X)  # 16 * batch bytes: batch 3 fits
    from tcexport.formats.errors import WorkspaceLimitError
    with pytest.raises(WorkspaceLimitError, match="max_workspace_bytes=48") as e:
        model(np.zeros((4, 4), np.float32))
    assert e.value.got == 64 and e.value.expected == 48
    with pytest.raises(TcError, match="max_workspace_bytes"):
        load(package, max_workspace_bytes=-1)


def test_views_keep_the_memory_alive(package):
    model = load(package)
    with pytest.raises(BufferError):
        model.archive.memory.close()
    np.testing.assert_array_equal(model(X), X + WEIGHTS["w"])


@pytest.mark.slow
def test_tcexport_sign_key(tmp_path):
    from packages import EXAMPLES
    a, a_pub = _keys(tmp_path, "a")
    out = tmp_path / "mlp.tcpkg"
    r = subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", str(EXAMPLES / "mlp.py"), "-o", str(out),
                        "--sign-key", str(a), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["signed"] is True and summary["digest"] == open_archive(out).digest
    assert _tcpkg("verify", str(out), "--trusted-key", str(a_pub)).returncode == 0
    (tmp_path / "bad.pem").write_text("not a key")
    r = subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", str(EXAMPLES / "mlp.py"), "-o",
                        str(tmp_path / "x.tcpkg"), "--sign-key", str(tmp_path / "bad.pem"), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == SignatureError.exit_code and json.loads(r.stdout)["error"]["type"] == "SignatureError"
    assert not (tmp_path / "x.tcpkg").exists()


def test_release_gives_the_private_copy_back_and_reads_verify_again(package, tmp_path):
    from tcexport.loader.weights import load_weights
    archive = open_archive(package)
    weights = load_weights(archive)
    assert not archive.release()  # a view is alive: nothing is given back under it
    del weights
    assert archive.release() and archive.memory is None
    assert archive.read(KERNEL_FILE) == dict(read_entries(package))[KERNEL_FILE]  # read again, verified
    raw = bytearray(package.read_bytes())
    offset, size = archive.file_span(KERNEL_FILE)
    raw[offset + size // 2] ^= 1
    package.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match="changed on disk"):
        archive.read(KERNEL_FILE)
