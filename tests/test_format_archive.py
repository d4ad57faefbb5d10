"""write_archive: determinism, alignment, atomicity, names; open_archive: every hostile-archive rule."""

import hashlib
import json
import os
import struct
import zipfile

import pytest

from loader_helpers import KERNEL_FILE, build_package, default_members, make_manifest
from tcexport.formats import container
from tcexport.formats.attestation import unsigned
from tcexport.formats.errors import FormatError, IntegrityError, VersionError
from tcexport.formats.manifest import MANIFEST_NAME, parse_manifest
from tcexport.loader.archive import MAX_MANIFEST_BYTES, open_archive
from tcexport.packager.archive import write_archive


def test_byte_identical_rebuilds(tmp_path):
    a = build_package(tmp_path / "a.tcpkg")
    b = build_package(tmp_path / "b.tcpkg")
    assert a.read_bytes() == b.read_bytes()


def test_member_order_and_zip_fields(tmp_path):
    p = build_package(tmp_path / "a.tcpkg")
    with zipfile.ZipFile(p) as z:
        infos = z.infolist()
        assert [i.filename for i in infos] == [MANIFEST_NAME, KERNEL_FILE, "src/add.c", "weights.safetensors"]
        assert z.comment.startswith(b'{"payload":')  # the attestation
        for i in infos:
            assert i.compress_type == zipfile.ZIP_STORED
            assert i.date_time == (1980, 1, 1, 0, 0, 0)
            assert i.external_attr == 0o644 << 16
            assert i.create_system == 3
        assert z.testzip() is None


def test_every_member_is_64_byte_aligned(tmp_path):
    members = {f"src/f{i}.txt": b"x" * i for i in range(70)}
    members.update(default_members())
    manifest = make_manifest(sources=tuple(sorted(members)[:-2]))
    p = build_package(tmp_path / "a.tcpkg", manifest, members)
    archive = open_archive(p)
    assert sorted(archive.names()) == sorted(members)
    for name in archive.names() + [MANIFEST_NAME]:
        offset = archive._entries[name].offset
        assert offset % 64 == 0, name
    for name in archive.names():
        assert archive.read(name) == members[name]


def test_manifest_lists_every_member_with_hash_and_size(tmp_path):
    members = default_members()
    archive = open_archive(build_package(tmp_path / "a.tcpkg", members=members))
    assert archive.manifest.members == {
        n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in members.items()}
    assert MANIFEST_NAME not in archive.manifest.members


@pytest.mark.parametrize("name", ["/abs", "../up", "a/../b", "a\\b", "C:x", "", "a\x00b", "a//b", "./a", "dir/"])
def test_write_rejects_unsafe_names(tmp_path, name):
    members = default_members()
    members[name] = b"x"
    with pytest.raises(FormatError, match="member name"):
        write_archive(tmp_path / "a.tcpkg", make_manifest(), members)
    assert not list(tmp_path.iterdir())


def test_write_rejects_manifest_as_member(tmp_path):
    members = default_members()
    members[MANIFEST_NAME] = b"{}"
    with pytest.raises(FormatError, match="manifest.json"):
        write_archive(tmp_path / "a.tcpkg", make_manifest(), members)


def test_write_rejects_manifest_referring_to_absent_member(tmp_path):
    members = default_members()
    del members[KERNEL_FILE]
    with pytest.raises(FormatError, match=KERNEL_FILE):
        write_archive(tmp_path / "a.tcpkg", make_manifest(), members)


@pytest.mark.parametrize("exc", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_interrupted_write_leaves_old_file_and_no_temp(tmp_path, monkeypatch, exc):
    path = tmp_path / "a.tcpkg"
    path.write_bytes(b"old package")
    real = container.write_member
    calls = []

    def failing(f, name, data):
        calls.append(name)
        if len(calls) == 2:
            raise exc
        return real(f, name, data)

    monkeypatch.setattr(container, "write_member", failing)
    with pytest.raises(type(exc)):
        build_package(path)
    assert path.read_bytes() == b"old package"
    assert sorted(os.listdir(tmp_path)) == ["a.tcpkg"]


# -- hostile archives, built by hand with zipfile ------------------------------------------------------------


class _Entries(list):
    """(name, bytes) of a package's members, carrying its attestation (the archive comment) along."""
    comment = b""

    def _like(self, items) -> "_Entries":
        out = _Entries(items)
        out.comment = self.comment
        return out

    def __add__(self, other):
        return self._like(list(self) + list(other))

    def __getitem__(self, k):
        return self._like(list.__getitem__(self, k)) if isinstance(k, slice) else list.__getitem__(self, k)


def _good_entries(tmp_path):
    """(name, bytes) of a valid package, to be re-zipped with one thing wrong."""
    with zipfile.ZipFile(build_package(tmp_path / "good.tcpkg")) as z:
        out = _Entries((i.filename, z.read(i)) for i in z.infolist())
        out.comment = z.comment
        return out


def _rezip(path, entries, compress=zipfile.ZIP_STORED):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # zipfile warns about duplicate names
        with zipfile.ZipFile(path, "w", compression=compress) as z:
            for name, data in entries:
                z.writestr(name, data)
            z.comment = getattr(entries, "comment", b"")
    return path


def _with_manifest(entries, edit):
    """The entries with the manifest edited and the package digest recomputed (as an editor would)."""
    d = json.loads(entries[0][1])
    edit(d)
    raw = json.dumps(d).encode()
    out = _Entries([(MANIFEST_NAME, raw)] + entries[1:])
    out.comment = unsigned(raw, (1, 7)).to_bytes()
    return out


def test_rezipped_good_package_opens(tmp_path):
    open_archive(_rezip(tmp_path / "b.tcpkg", _good_entries(tmp_path)))


@pytest.mark.parametrize("name", ["../evil.so", "/etc/passwd", "a\\b.so", "C:evil", "a/./b"])
def test_zip_slip_names_rejected(tmp_path, name):
    entries = _good_entries(tmp_path) + [(name, b"x")]
    with pytest.raises(FormatError, match="member name"):
        open_archive(_rezip(tmp_path / "b.tcpkg", entries))


def test_nul_in_name_rejected(tmp_path):
    """zipfile truncates names at NUL (a malware trick); the loader must see and reject the raw name."""
    entries = _good_entries(tmp_path) + [("weights.safetensorsQ.txt", b"x")]
    p = _rezip(tmp_path / "b.tcpkg", entries)
    p.write_bytes(p.read_bytes().replace(b"weights.safetensorsQ.txt", b"weights.safetensors\x00.txt"))
    with pytest.raises(FormatError, match="NUL"):
        open_archive(p)


def test_duplicate_member_rejected(tmp_path):
    entries = _good_entries(tmp_path)
    with pytest.raises(FormatError, match="more than once"):
        open_archive(_rezip(tmp_path / "b.tcpkg", entries + [entries[-1]]))


def test_compressed_member_rejected(tmp_path):
    with pytest.raises(FormatError, match="compressed"):
        open_archive(_rezip(tmp_path / "b.tcpkg", _good_entries(tmp_path), zipfile.ZIP_DEFLATED))


def test_encrypted_member_rejected(tmp_path):
    p = _rezip(tmp_path / "b.tcpkg", _good_entries(tmp_path))
    raw = bytearray(p.read_bytes())
    cd = raw.rfind(b"PK\x01\x02")             # last central header: set its encryption bit
    raw[cd + 8] |= 1
    p.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="encrypted"):
        open_archive(p)


def test_extra_member_rejected(tmp_path):
    entries = _good_entries(tmp_path) + [("src/extra.txt", b"sneaky")]
    with pytest.raises(IntegrityError, match=r"'src/extra.txt'.*not listed"):
        open_archive(_rezip(tmp_path / "b.tcpkg", entries))


def test_missing_member_rejected(tmp_path):
    entries = _good_entries(tmp_path)
    entries = entries._like([e for e in entries if e[0] != "src/add.c"])
    with pytest.raises(IntegrityError, match=r"'src/add.c'.*missing"):
        open_archive(_rezip(tmp_path / "b.tcpkg", entries))


def test_altered_byte_rejected(tmp_path):
    p = build_package(tmp_path / "a.tcpkg")
    offset, size = open_archive(p).file_span(KERNEL_FILE)
    raw = bytearray(p.read_bytes())
    raw[offset + size // 2] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match=rf"'{KERNEL_FILE}' has SHA-256 [0-9a-f]{{64}}; .* expects"):
        open_archive(p)


def test_size_mismatch_rejected(tmp_path):
    entries = _good_entries(tmp_path)
    entries = entries._like([(n, d + b"!" if n == "src/add.c" else d) for n, d in entries])
    with pytest.raises(IntegrityError, match=r"'src/add.c' has \d+ bytes; manifest.members expects \d+"):
        open_archive(_rezip(tmp_path / "b.tcpkg", entries))


def test_oversized_manifest_rejected(tmp_path):
    entries = _good_entries(tmp_path)
    entries[0] = (MANIFEST_NAME, entries[0][1][:-2] + b" " * MAX_MANIFEST_BYTES + b"}\n")
    with pytest.raises(FormatError, match="limit"):
        open_archive(_rezip(tmp_path / "b.tcpkg", entries))


def test_missing_manifest_rejected(tmp_path):
    with pytest.raises(FormatError, match="no manifest.json"):
        open_archive(_rezip(tmp_path / "b.tcpkg", _good_entries(tmp_path)[1:]))


def test_deeply_nested_manifest_rejected(tmp_path):
    entries = _good_entries(tmp_path)
    entries[0] = (MANIFEST_NAME, b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(FormatError):
        open_archive(_rezip(tmp_path / "b.tcpkg", entries))


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04" + b"\0" * 100])
def test_not_a_zip(tmp_path, content):
    p = tmp_path / "bad.tcpkg"
    p.write_bytes(content)
    with pytest.raises(FormatError, match="not a valid zip"):
        open_archive(p)


def test_missing_file(tmp_path):
    with pytest.raises(FormatError, match="cannot read"):
        open_archive(tmp_path / "nope.tcpkg")


def test_truncated_archive_rejected(tmp_path):
    p = build_package(tmp_path / "a.tcpkg")
    raw = p.read_bytes()
    p.write_bytes(raw[:len(raw) // 2])
    with pytest.raises(FormatError):
        open_archive(p)


def test_newer_major_version_rejected(tmp_path):
    entries = _with_manifest(_good_entries(tmp_path), lambda d: d.update(format_version=[2, 0]))
    with pytest.raises(VersionError, match="Upgrade tcexport"):
        open_archive(_rezip(tmp_path / "b.tcpkg", entries))


def test_newer_minor_version_with_unknown_fields_loads(tmp_path):
    def edit(d):
        d["format_version"] = [1, 9]
        d["future_field"] = {"anything": [1, 2]}
        d["inputs"][0]["layout"] = "strided"
    entries = _with_manifest(_good_entries(tmp_path), edit)
    archive = open_archive(_rezip(tmp_path / "b.tcpkg", entries))
    assert archive.manifest.format_version == (1, 9)


def test_manifest_round_trips(tmp_path):
    archive = open_archive(build_package(tmp_path / "a.tcpkg"))
    assert parse_manifest(archive.manifest.dumps()) == archive.manifest


def test_alignment_extra_field_layout_is_pinned():
    """The alignment extra field is zipalign's: id 0xD935, u16 alignment, zero padding."""
    extra = container.align_extra(100)
    ident, size, align = struct.unpack_from("<HHH", extra)
    assert (ident, align) == (0xD935, 64) and size == len(extra) - 4 and (100 + len(extra)) % 64 == 0
