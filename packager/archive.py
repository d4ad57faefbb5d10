"""Write a `.tcpkg` archive: a deterministic, uncompressed, 64-byte-aligned zip (formats/SPEC.md).

The zip is written by hand rather than with ``zipfile`` so that every byte is ours to pin: the layout
does not drift with the Python version, the alignment padding lives only in local headers (zipalign
style), and the same manifest and members always give a byte-identical file. Members are stored, not
compressed, so the loader can memory-map weights and hash members in place.
"""

from __future__ import annotations

import dataclasses
import pathlib
import struct
import zlib
from typing import BinaryIO, Mapping

from tcexport.formats.errors import FormatError
from tcexport.formats.files import write_atomically
from tcexport.formats.manifest import MANIFEST_NAME, Manifest, parse_manifest
from tcexport.formats.members import check_member_name, sha256_hex

ALIGNMENT = 64
ALIGN_EXTRA_ID = 0xD935        # zipalign's extra field: u16 alignment, then zero padding
ZIP64_EXTRA_ID = 0x0001
_U32_MAX = 0xFFFFFFFF
_DOS_DATE = (0 << 9) | (1 << 5) | 1   # 1980-01-01
_DOS_TIME = 0                          # 00:00:00
_EXTERNAL_ATTR = 0o644 << 16
_MADE_BY = (3 << 8) | 45              # "Unix", zip spec 4.5
_VERSION_NEEDED = 20
_VERSION_NEEDED_ZIP64 = 45
_UTF8_FLAG = 0x800


@dataclasses.dataclass
class _Entry:
    """What the central directory needs to know about one written member."""
    name: bytes
    flags: int
    crc: int
    size: int
    offset: int


def write_archive(path, manifest: Manifest, members: Mapping[str, bytes]) -> pathlib.Path:
    """Write ``manifest`` and ``members`` to ``path`` atomically; return the path.

    ``manifest.members`` is filled in here (SHA-256 and size of every member), so callers pass a
    manifest whose ``members`` is empty or stale. The result is parsed back before anything is written,
    so a package that the loader would reject is never produced.
    """
    path = pathlib.Path(path)
    names = sorted(members)
    for name in names:
        check_member_name(name)
        if name == MANIFEST_NAME:
            raise FormatError(f"archive member {MANIFEST_NAME!r} is written from the manifest; "
                              f"do not pass it in members")
    listed = {n: {"sha256": sha256_hex(members[n]), "size": len(members[n])} for n in names}
    manifest = dataclasses.replace(manifest, members=listed)
    manifest_bytes = manifest.dumps()
    parse_manifest(manifest_bytes)
    ordered = [(MANIFEST_NAME, manifest_bytes)] + [(n, members[n]) for n in names]
    write_atomically(path, lambda f: _write_zip(f, ordered), mode=0o644)
    return path


def _write_zip(f: BinaryIO, ordered: list[tuple[str, bytes]]) -> None:
    entries = [_write_member(f, name, data) for name, data in ordered]
    _write_central_directory(f, entries)


def _encode_name(name: str) -> tuple[bytes, int]:
    try:
        return name.encode("ascii"), 0
    except UnicodeEncodeError:
        return name.encode("utf-8"), _UTF8_FLAG


def _align_extra(data_start_without_extra: int) -> bytes:
    """The 0xD935 extra field that puts the member's data on a 64-byte boundary."""
    base = data_start_without_extra + 6          # id, size, alignment
    pad = (-base) % ALIGNMENT
    return struct.pack("<HHH", ALIGN_EXTRA_ID, 2 + pad, ALIGNMENT) + b"\0" * pad


def _write_member(f: BinaryIO, name: str, data: bytes) -> _Entry:
    """Write one local header (with alignment padding) and the stored data."""
    offset = f.tell()
    raw_name, flags = _encode_name(name)
    size = len(data)
    zip64 = size >= _U32_MAX
    zip64_extra = struct.pack("<HHQQ", ZIP64_EXTRA_ID, 16, size, size) if zip64 else b""
    extra = zip64_extra + _align_extra(offset + 30 + len(raw_name) + len(zip64_extra))
    crc = zlib.crc32(data)
    stored_size = _U32_MAX if zip64 else size
    f.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, _VERSION_NEEDED_ZIP64 if zip64 else _VERSION_NEEDED,
                        flags, 0, _DOS_TIME, _DOS_DATE, crc, stored_size, stored_size,
                        len(raw_name), len(extra)))
    f.write(raw_name)
    f.write(extra)
    f.write(data)
    return _Entry(raw_name, flags, crc, size, offset)


def _central_header(e: _Entry) -> bytes:
    big_size, big_offset = e.size >= _U32_MAX, e.offset >= _U32_MAX
    z64 = (struct.pack("<QQ", e.size, e.size) if big_size else b"") + \
        (struct.pack("<Q", e.offset) if big_offset else b"")
    extra = struct.pack("<HH", ZIP64_EXTRA_ID, len(z64)) + z64 if z64 else b""
    size = _U32_MAX if big_size else e.size
    needed = _VERSION_NEEDED_ZIP64 if z64 else _VERSION_NEEDED
    return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, _MADE_BY, needed, e.flags, 0, _DOS_TIME, _DOS_DATE,
                       e.crc, size, size, len(e.name), len(extra), 0, 0, 0, _EXTERNAL_ATTR,
                       _U32_MAX if big_offset else e.offset) + e.name + extra


def _write_central_directory(f: BinaryIO, entries: list[_Entry]) -> None:
    cd_offset = f.tell()
    for e in entries:
        f.write(_central_header(e))
    cd_size = f.tell() - cd_offset
    count = len(entries)
    if count >= 0xFFFF or cd_offset >= _U32_MAX or cd_size >= _U32_MAX:
        z64_offset = f.tell()
        f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, _MADE_BY, _VERSION_NEEDED_ZIP64, 0, 0,
                            count, count, cd_size, cd_offset))
        f.write(struct.pack("<IIQI", 0x07064B50, 0, z64_offset, 1))
        count, cd_size, cd_offset = min(count, 0xFFFF), min(cd_size, _U32_MAX), min(cd_offset, _U32_MAX)
    f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, cd_size, cd_offset, 0))
