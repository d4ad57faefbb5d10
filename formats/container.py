"""The zip container of a `.tcpkg` (SPEC §1): the canonical writer, and a strict reader of the directory.

The writer is by hand rather than ``zipfile`` so that every byte is ours to pin: the layout does not drift with
the Python version, alignment padding lives only in local headers (zipalign style), and the same members give a
byte-identical file. The reader is by hand too, because it reads hostile files: every count and offset is checked
against the file's size before it is used, names are checked as their raw bytes (``zipfile`` truncates at NUL),
the local header must agree with the central one, and whatever it meets ends in a FormatError, never in one of
``zipfile``'s own exceptions or a MemoryError. Both live here because they are one rule, read two ways, and both
the packager (writing) and the loader (reading, and re-signing) use them.
"""

from __future__ import annotations

import pathlib
import re
import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterable

from .errors import FormatError
from .files import write_atomically
from .members import check_member_name

ALIGNMENT = 64
ALIGN_EXTRA_ID = 0xD935        # zipalign's extra field: u16 alignment, then zero padding
ZIP64_EXTRA_ID = 0x0001
MAX_MEMBERS = 1 << 20          # far above any package; bounds the directory a reader accepts
_U16_MAX, _U32_MAX = 0xFFFF, 0xFFFFFFFF
_DOS_DATE = (0 << 9) | (1 << 5) | 1   # 1980-01-01
_DOS_TIME = 0                          # 00:00:00
_EXTERNAL_ATTR = 0o644 << 16
_MADE_BY = (3 << 8) | 45              # "Unix", zip spec 4.5
_VERSION_NEEDED = 20
_VERSION_NEEDED_ZIP64 = 45
_UTF8_FLAG = 0x800
_ENCRYPTED_FLAG, _DESCRIPTOR_FLAG = 0x1, 0x8

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_EOCD = struct.Struct("<IHHHHIIH")
_ZIP64_LOCATOR = struct.Struct("<IIQI")
_ZIP64_EOCD = struct.Struct("<IQHHIIQQQQ")
_LOCAL_SIG, _CENTRAL_SIG, _EOCD_SIG = 0x04034B50, 0x02014B50, 0x06054B50
_PRINTABLE = re.compile(rb"[\x20-\x7e]*\n?")
_ZIP64_LOCATOR_SIG, _ZIP64_EOCD_SIG = 0x07064B50, 0x06064B50


# ---------------------------------------------------------------------------------------------------------
# writing


@dataclass
class _Written:
    """What the central directory needs to know about one written member."""
    name: bytes
    flags: int
    crc: int
    size: int
    offset: int


def write_package(path, manifest_bytes: bytes, attestation: bytes, ordered: list, check=None):
    """A package of these exact manifest bytes, then the ``(name, data)`` members in name order (SPEC §1's order),
    with ``attestation`` as the archive comment, written atomically; a signer uses it to add a signature without
    changing anything else. ``check`` runs on the finished temp file before the rename (files.write_atomically)."""
    path = pathlib.Path(path)
    entries = [("manifest.json", manifest_bytes)] + list(ordered)
    write_atomically(path, lambda f: write_container(f, entries, attestation), mode=0o644, check=check)
    return path


def write_container(f: BinaryIO, ordered: Iterable[tuple[str, bytes]], comment: bytes = b"") -> None:
    """Write ``(name, data)`` members in the given order, each stored and 64-byte aligned, then the directory and
    the archive ``comment`` (the attestation; a zip comment is at most 65535 bytes)."""
    if len(comment) > _U16_MAX:
        raise FormatError(f"the archive comment (the attestation) is {len(comment)} bytes; a zip allows {_U16_MAX}")
    entries = [write_member(f, name, data) for name, data in ordered]
    _write_central_directory(f, entries, comment)


def _encode_name(name: str) -> tuple[bytes, int]:
    try:
        return name.encode("ascii"), 0
    except UnicodeEncodeError:
        return name.encode("utf-8"), _UTF8_FLAG


def align_extra(data_start_without_extra: int) -> bytes:
    """The 0xD935 extra field that puts the member's data on a 64-byte boundary."""
    base = data_start_without_extra + 6          # id, size, alignment
    pad = (-base) % ALIGNMENT
    return struct.pack("<HHH", ALIGN_EXTRA_ID, 2 + pad, ALIGNMENT) + b"\0" * pad


def write_member(f: BinaryIO, name: str, data) -> _Written:
    """Write one local header (with alignment padding) and the stored data."""
    offset = f.tell()
    raw_name, flags = _encode_name(name)
    size = len(data)
    zip64 = size >= _U32_MAX
    zip64_extra = struct.pack("<HHQQ", ZIP64_EXTRA_ID, 16, size, size) if zip64 else b""
    extra = zip64_extra + align_extra(offset + 30 + len(raw_name) + len(zip64_extra))
    crc = zlib.crc32(data)
    stored_size = _U32_MAX if zip64 else size
    f.write(_LOCAL.pack(_LOCAL_SIG, _VERSION_NEEDED_ZIP64 if zip64 else _VERSION_NEEDED, flags, 0, _DOS_TIME,
                        _DOS_DATE, crc, stored_size, stored_size, len(raw_name), len(extra)))
    f.write(raw_name)
    f.write(extra)
    f.write(data)
    return _Written(raw_name, flags, crc, size, offset)


def _central_header(e: _Written) -> bytes:
    big_size, big_offset = e.size >= _U32_MAX, e.offset >= _U32_MAX
    z64 = (struct.pack("<QQ", e.size, e.size) if big_size else b"") + \
        (struct.pack("<Q", e.offset) if big_offset else b"")
    extra = struct.pack("<HH", ZIP64_EXTRA_ID, len(z64)) + z64 if z64 else b""
    size = _U32_MAX if big_size else e.size
    needed = _VERSION_NEEDED_ZIP64 if z64 else _VERSION_NEEDED
    return _CENTRAL.pack(_CENTRAL_SIG, _MADE_BY, needed, e.flags, 0, _DOS_TIME, _DOS_DATE, e.crc, size, size,
                         len(e.name), len(extra), 0, 0, 0, _EXTERNAL_ATTR,
                         _U32_MAX if big_offset else e.offset) + e.name + extra


def _write_central_directory(f: BinaryIO, entries: list[_Written], comment: bytes = b"") -> None:
    cd_offset = f.tell()
    for e in entries:
        f.write(_central_header(e))
    cd_size = f.tell() - cd_offset
    count = len(entries)
    if count >= _U16_MAX or cd_offset >= _U32_MAX or cd_size >= _U32_MAX:
        z64_offset = f.tell()
        f.write(_ZIP64_EOCD.pack(_ZIP64_EOCD_SIG, 44, _MADE_BY, _VERSION_NEEDED_ZIP64, 0, 0,
                                 count, count, cd_size, cd_offset))
        f.write(_ZIP64_LOCATOR.pack(_ZIP64_LOCATOR_SIG, 0, z64_offset, 1))
        count, cd_size, cd_offset = min(count, _U16_MAX), min(cd_size, _U32_MAX), min(cd_offset, _U32_MAX)
    f.write(_EOCD.pack(_EOCD_SIG, 0, 0, count, count, cd_size, cd_offset, len(comment)))
    f.write(comment)


# ---------------------------------------------------------------------------------------------------------
# reading


@dataclass(frozen=True)
class Entry:
    """One member as the directory and its local header describe it."""
    name: str
    header_offset: int  # file offset of the local header
    offset: int         # file offset of the member's data
    size: int
    crc: int


ReadAt = Callable[[int, int], bytes]  # (offset, count) -> exactly count bytes, or fewer at the end of the file


@dataclass(frozen=True)
class Directory:
    entries: list     # Entry, in directory order
    comment: bytes    # the archive comment: the attestation since format 1.7, empty before


def read_directory(read_at: ReadAt, file_size: int, where: str) -> Directory:
    """Every member of the archive, in directory order, and the archive comment, after the structural rules of
    SPEC §1: one end record, followed by exactly its comment, which is printable ASCII (so no end-record signature
    can hide in it); no multi-disk archive; members stored and unencrypted, no data descriptors; safe unique names
    that the local headers repeat; data inside the file and not overlapping."""
    cd_offset, cd_size, count, comment = _end_records(read_at, file_size, where)
    if count > MAX_MEMBERS or count * _CENTRAL.size > cd_size:
        raise FormatError(f"{where}: the zip directory claims {count} members in {cd_size} bytes; "
                          f"this is not a valid .tcpkg (at most {MAX_MEMBERS} members)")
    directory = _read_exact(read_at, cd_offset, cd_size, where, "the zip central directory")
    entries, names, at = [], set(), 0
    for k in range(count):
        entry, at = _central_entry(read_at, directory, at, cd_offset, where, k)
        if entry.name in names:
            raise FormatError(f"{where}: member {entry.name!r} appears more than once; each member name must be "
                              f"unique")
        names.add(entry.name)
        entries.append(entry)
    if at != cd_size:
        raise FormatError(f"{where}: the zip central directory has {cd_size - at} bytes after its {count} "
                          f"entries; the archive is damaged or was not written by tcexport")
    _check_no_overlap(entries, cd_offset, where)
    return Directory(entries, comment)


def _not_a_zip(where: str, why: str) -> FormatError:
    return FormatError(f"{where}: not a valid zip archive ({why}); a .tcpkg is a zip written by tcexport. "
                       f"Rebuild the package.")


def _read_exact(read_at: ReadAt, offset: int, count: int, where: str, what: str) -> bytes:
    data = read_at(offset, count) if count else b""
    if len(data) != count:
        raise FormatError(f"{where}: {what} ({count} bytes at offset {offset}) runs past the end of the file; "
                          f"the file is truncated")
    return data


def _end_records(read_at: ReadAt, file_size: int, where: str) -> tuple[int, int, int, bytes]:
    """(directory offset, directory size, member count, archive comment)."""
    if file_size < _EOCD.size:
        raise _not_a_zip(where, f"{file_size} bytes is too short for a zip")
    tail_at = max(0, file_size - _EOCD.size - _U16_MAX)
    tail = _read_exact(read_at, tail_at, file_size - tail_at, where, "the end of the file")
    at = tail.rfind(b"PK\x05\x06", 0, max(0, len(tail) - _EOCD.size + 4))  # a whole record must follow
    while at >= 0 and at + _EOCD.size + struct.unpack_from("<H", tail, at + 20)[0] != len(tail):
        at = tail.rfind(b"PK\x05\x06", 0, at)
    if at < 0:
        raise _not_a_zip(where, "no end-of-central-directory record followed by exactly its comment at the end")
    sig, disk, cd_disk, n_here, n_total, cd_size, cd_offset, comment_len = _EOCD.unpack_from(tail, at)
    comment = tail[at + _EOCD.size:]
    if not _PRINTABLE.fullmatch(comment):
        raise _not_a_zip(where, "the archive comment is not printable ASCII (a .tcpkg's comment is its attestation, "
                                "JSON)")
    if n_here != n_total or disk not in (0, _U16_MAX) or cd_disk not in (0, _U16_MAX):
        raise _not_a_zip(where, "it spans several disks")
    eocd_at = tail_at + at
    end = eocd_at
    if _U16_MAX in (n_total, disk, cd_disk) or _U32_MAX in (cd_size, cd_offset):
        n_total, cd_size, cd_offset, end = _zip64_end(read_at, eocd_at, where)
    if cd_offset + cd_size != end:
        raise _not_a_zip(where, f"the central directory ({cd_size} bytes at {cd_offset}) does not end where the "
                                f"end records start ({end})")
    return cd_offset, cd_size, n_total, comment


def _zip64_end(read_at: ReadAt, eocd_at: int, where: str) -> tuple[int, int, int, int]:
    locator_at = eocd_at - _ZIP64_LOCATOR.size
    if locator_at < 0:
        raise _not_a_zip(where, "the end record needs zip64 records, which are missing")
    sig, disk, record_at, disks = _ZIP64_LOCATOR.unpack(
        _read_exact(read_at, locator_at, _ZIP64_LOCATOR.size, where, "the zip64 locator"))
    if sig != _ZIP64_LOCATOR_SIG or disk != 0 or disks != 1:
        raise _not_a_zip(where, "the zip64 end locator is missing or names another disk")
    if record_at + _ZIP64_EOCD.size != locator_at:
        raise _not_a_zip(where, f"the zip64 end record at {record_at} does not sit before its locator")
    (sig, size, _, _, disk, cd_disk, n_here, n_total, cd_size,
     cd_offset) = _ZIP64_EOCD.unpack(_read_exact(read_at, record_at, _ZIP64_EOCD.size, where, "the zip64 end record"))
    if sig != _ZIP64_EOCD_SIG or size != _ZIP64_EOCD.size - 12 or disk or cd_disk or n_here != n_total:
        raise _not_a_zip(where, "the zip64 end record is malformed")
    return n_total, cd_size, cd_offset, record_at


def _central_entry(read_at: ReadAt, directory: bytes, at: int, cd_offset: int, where: str,
                   k: int) -> tuple[Entry, int]:
    if at + _CENTRAL.size > len(directory):
        raise FormatError(f"{where}: zip directory entry {k} runs past the end of the directory")
    (sig, _, _, flags, method, _, _, crc, csize, usize, name_len, extra_len, comment_len, disk, _, _,
     header_offset) = _CENTRAL.unpack_from(directory, at)
    if sig != _CENTRAL_SIG:
        raise FormatError(f"{where}: zip directory entry {k} has no central header signature")
    start = at + _CENTRAL.size
    end = start + name_len + extra_len + comment_len
    if end > len(directory):
        raise FormatError(f"{where}: zip directory entry {k} runs past the end of the directory")
    raw_name = directory[start:start + name_len]
    name = _decode_name(raw_name, flags, where)
    extra = directory[start + name_len:start + name_len + extra_len]
    usize, csize, header_offset = _zip64_fields(extra, usize, csize, header_offset, name, where)
    if flags & _ENCRYPTED_FLAG:
        raise FormatError(f"{where}: member {name!r} is encrypted; tcpkg members must not be encrypted")
    if method != 0:
        raise FormatError(f"{where}: member {name!r} is compressed (method {method}); tcpkg members must be stored "
                          f"uncompressed (method 0)")
    if flags & _DESCRIPTOR_FLAG:
        raise FormatError(f"{where}: member {name!r} uses a zip data descriptor; tcpkg members carry their sizes "
                          f"in their headers")
    if csize != usize:
        raise FormatError(f"{where}: member {name!r} is stored but its compressed size {csize} differs from its "
                          f"size {usize}")
    if disk not in (0, _U16_MAX):
        raise _not_a_zip(where, f"member {name!r} is on another disk")
    offset = _local_data_offset(read_at, raw_name, name, header_offset, usize, cd_offset, where)
    return Entry(name, header_offset, offset, usize, crc), end


def _decode_name(raw: bytes, flags: int, where: str) -> str:
    """The member name from its raw bytes: UTF-8 where the zip says so, else it must be ASCII (tcexport never
    writes cp437 names, whose meaning differs between tools). Then the SPEC's name rules."""
    try:
        name = raw.decode("utf-8" if flags & _UTF8_FLAG else "ascii")
    except UnicodeDecodeError:
        raise FormatError(f"{where}: archive member name {raw[:80]!r} is not "
                          f"{'valid UTF-8' if flags & _UTF8_FLAG else 'ASCII (and not flagged UTF-8)'}") from None
    try:
        return check_member_name(name)
    except FormatError as e:
        raise FormatError(f"{where}: {e}") from None


def _zip64_fields(extra: bytes, usize: int, csize: int, offset: int, name: str, where: str) -> tuple[int, int, int]:
    """Replace the 32-bit fields that hold 0xFFFFFFFF by the zip64 extra field's 64-bit values, in its order."""
    if _U32_MAX not in (usize, csize, offset):
        return usize, csize, offset
    at = 0
    while at + 4 <= len(extra):
        ident, size = struct.unpack_from("<HH", extra, at)
        body = extra[at + 4:at + 4 + size]
        if len(body) != size:
            break
        if ident == ZIP64_EXTRA_ID:
            values = [usize, csize, offset]
            pos = 0
            for i, v in enumerate(values):
                if v == _U32_MAX:
                    if pos + 8 > size:
                        raise FormatError(f"{where}: member {name!r}: its zip64 extra field is too short")
                    values[i] = struct.unpack_from("<Q", body, pos)[0]
                    pos += 8
            return values[0], values[1], values[2]
        at += 4 + size
    raise FormatError(f"{where}: member {name!r} needs a zip64 extra field for its size or offset, and has none")


def _local_data_offset(read_at: ReadAt, raw_name: bytes, name: str, start: int, size: int, cd_offset: int,
                       where: str) -> int:
    """Where the member's data starts, from its local header, which must name the same file with the same
    storage as the central directory does; the data must end before the directory starts."""
    if start + _LOCAL.size > cd_offset:
        raise FormatError(f"{where}: member {name!r}: local header offset {start} is outside the archive's data")
    (sig, _, flags, method, _, _, _, csize, usize, name_len,
     extra_len) = _LOCAL.unpack(_read_exact(read_at, start, _LOCAL.size, where, f"member {name!r}'s local header"))
    if sig != _LOCAL_SIG:
        raise FormatError(f"{where}: member {name!r}: no local header at offset {start}")
    local_name = _read_exact(read_at, start + _LOCAL.size, name_len, where, f"member {name!r}'s local name")
    if local_name != raw_name:
        raise FormatError(f"{where}: member {name!r}: the local header names it "
                          f"{local_name[:80].decode('utf-8', 'replace')!r}; the two names must agree")
    if method != 0 or flags & (_ENCRYPTED_FLAG | _DESCRIPTOR_FLAG):
        raise FormatError(f"{where}: member {name!r}: the local header's storage (method {method}, flags "
                          f"{flags:#x}) disagrees with the central directory's (stored, unencrypted)")
    if (csize, usize) not in ((size, size), (_U32_MAX, _U32_MAX)):
        raise FormatError(f"{where}: member {name!r}: the local header gives {usize} bytes, the central directory "
                          f"{size}")
    offset = start + _LOCAL.size + name_len + extra_len
    if offset + size > cd_offset:
        raise FormatError(f"{where}: member {name!r}: {size} bytes at offset {offset} run into the zip directory "
                          f"at {cd_offset}; the file is truncated or damaged")
    return offset


def _check_no_overlap(entries: list[Entry], cd_offset: int, where: str) -> None:
    """Overlapping members are a zip-bomb trick and never written by tcexport."""
    end, previous = 0, None
    for e in sorted(entries, key=lambda e: e.header_offset):
        if e.header_offset < end:
            raise FormatError(f"{where}: members {previous!r} and {e.name!r} overlap in the file")
        end, previous = e.offset + e.size, e.name
