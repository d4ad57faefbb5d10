"""Open a `.tcpkg` archive and verify every member before anything else may use it.

``zipfile`` enumerates the central directory; the local headers are read here to find where each
member's bytes start, so members are hashed (and later memory-mapped) in place, never extracted.
All checks run in ``open_archive``: an Archive that exists has passed every integrity rule of
formats/SPEC.md, so native code is only ever loaded from verified bytes.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import pathlib
import struct
import zipfile

from tcexport.formats.errors import FormatError, IntegrityError
from tcexport.formats.manifest import MANIFEST_NAME, Manifest, parse_manifest
from tcexport.formats.members import check_member_name

MAX_MANIFEST_BYTES = 16 * 1024 * 1024
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
_LOCAL_SIGNATURE = 0x04034B50
_HASH_CHUNK = 64 * 1024 * 1024


class Archive:
    """A verified archive: its manifest, and each member's (offset, size) inside one read-only mapping.

    The mapping is copy-on-write (``ACCESS_COPY``): numpy views of the weights are writable for callers
    that need it, and the file on disk is never modified.
    """

    def __init__(self, path: pathlib.Path, manifest: Manifest, spans: dict[str, tuple[int, int]], mm: mmap.mmap):
        self.path = path
        self.manifest = manifest
        self._spans = spans
        self.mmap = mm

    def names(self) -> list[str]:
        return list(self._spans)

    def member_offset(self, name: str) -> tuple[int, int]:
        """Absolute file offset and size of a member's stored bytes."""
        try:
            return self._spans[name]
        except KeyError:
            raise FormatError(f"{self.path}: archive has no member {name!r} "
                              f"(members: {sorted(self._spans)})") from None

    def view(self, name: str) -> memoryview:
        """A zero-copy view of a member's bytes."""
        offset, size = self.member_offset(name)
        return memoryview(self.mmap)[offset:offset + size]

    def read(self, name: str) -> bytes:
        offset, size = self.member_offset(name)
        return self.mmap[offset:offset + size]

    def __repr__(self) -> str:
        return f"Archive({str(self.path)!r}, model={self.manifest.model!r}, members={len(self._spans)})"


def open_archive(path) -> Archive:
    """Open ``path``, check its zip structure and names, parse the manifest, and verify every member.

    Raises FormatError (malformed), VersionError (unreadable format version) or IntegrityError
    (a member missing, extra, or altered).
    """
    path = pathlib.Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            infos = _read_directory(f, path)
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
    except OSError as e:
        raise FormatError(f"{path}: cannot read the package: {e.strerror or e}") from None
    spans = _member_spans(path, infos, mm, size)
    manifest = _read_manifest(path, spans, mm)
    _verify_members(path, manifest, spans, mm)
    del spans[MANIFEST_NAME]
    return Archive(path, manifest, spans, mm)


def _read_directory(f, path: pathlib.Path) -> list[zipfile.ZipInfo]:
    try:
        with zipfile.ZipFile(f) as z:
            return z.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, struct.error) as e:
        raise FormatError(f"{path}: not a valid zip archive ({e}); a .tcpkg is a zip written by tcexport. "
                          f"Rebuild the package.") from None


def _member_spans(path: pathlib.Path, infos: list[zipfile.ZipInfo], mm, file_size: int) -> dict[str, tuple[int, int]]:
    """Check each central-directory entry and locate its data through its local header."""
    spans: dict[str, tuple[int, int]] = {}
    for info in infos:
        name = info.orig_filename
        try:
            check_member_name(name)
        except FormatError as e:
            raise FormatError(f"{path}: {e}") from None
        if name in spans:
            raise FormatError(f"{path}: member {name!r} appears more than once; each member name must be unique")
        if info.compress_type != zipfile.ZIP_STORED:
            raise FormatError(f"{path}: member {name!r} is compressed (method {info.compress_type}); "
                              f"tcpkg members must be stored uncompressed (method 0)")
        if info.flag_bits & 0x1:
            raise FormatError(f"{path}: member {name!r} is encrypted; tcpkg members must not be encrypted")
        if info.compress_size != info.file_size:
            raise FormatError(f"{path}: member {name!r} is stored but its compressed size {info.compress_size} "
                              f"differs from its size {info.file_size}")
        spans[name] = (_data_offset(path, info, mm, file_size), info.file_size)
    _check_no_overlap(path, spans)
    return spans


def _data_offset(path: pathlib.Path, info: zipfile.ZipInfo, mm, file_size: int) -> int:
    """Read the local header by hand: zipfile has no public API for where a member's bytes start."""
    name, start = info.orig_filename, info.header_offset
    if start < 0 or start + _LOCAL_HEADER.size > file_size:
        raise FormatError(f"{path}: member {name!r}: local header offset {start} is outside the file")
    fields = _LOCAL_HEADER.unpack_from(mm, start)
    if fields[0] != _LOCAL_SIGNATURE:
        raise FormatError(f"{path}: member {name!r}: no local header at offset {start}")
    name_len, extra_len = fields[9], fields[10]
    raw = mm[start + _LOCAL_HEADER.size:start + _LOCAL_HEADER.size + name_len]
    local_name = raw.decode("utf-8" if fields[3] & 0x800 else "cp437", errors="replace")
    if local_name != name:
        raise FormatError(f"{path}: member {name!r}: the local header names it {local_name!r}; "
                          f"the two names must agree")
    offset = start + _LOCAL_HEADER.size + name_len + extra_len
    if offset + info.file_size > file_size:
        raise FormatError(f"{path}: member {name!r}: {info.file_size} bytes at offset {offset} "
                          f"run past the end of the file ({file_size} bytes); the file is truncated")
    return offset


def _check_no_overlap(path: pathlib.Path, spans: dict[str, tuple[int, int]]) -> None:
    """Overlapping members are a zip-bomb trick and never written by tcexport."""
    end, previous = 0, None
    for name, (offset, size) in sorted(spans.items(), key=lambda kv: kv[1]):
        if offset < end:
            raise FormatError(f"{path}: members {previous!r} and {name!r} overlap in the file")
        end, previous = offset + size, name


def _read_manifest(path: pathlib.Path, spans: dict[str, tuple[int, int]], mm) -> Manifest:
    if MANIFEST_NAME not in spans:
        raise FormatError(f"{path}: no {MANIFEST_NAME} member; this is not a tcpkg archive")
    offset, size = spans[MANIFEST_NAME]
    if size > MAX_MANIFEST_BYTES:
        raise FormatError(f"{path}: {MANIFEST_NAME} is {size} bytes; the limit is {MAX_MANIFEST_BYTES} bytes")
    try:
        return parse_manifest(mm[offset:offset + size])
    except RecursionError:
        raise FormatError(f"{path}: {MANIFEST_NAME} nests too deeply to parse") from None


def _verify_members(path: pathlib.Path, manifest: Manifest, spans: dict[str, tuple[int, int]], mm) -> None:
    """Every member but the manifest is listed with its size and SHA-256, and nothing else is present."""
    present = set(spans) - {MANIFEST_NAME}
    listed = set(manifest.members)
    for name in sorted(present - listed):
        raise IntegrityError(f"{path}: member {name!r} is in the archive but not listed in manifest.members; "
                             f"expected only listed members. The package was altered; rebuild it.")
    for name in sorted(listed - present):
        raise IntegrityError(f"{path}: member {name!r} is listed in manifest.members but missing from the "
                             f"archive. The package is incomplete; rebuild it.")
    for name in sorted(listed):
        expected = manifest.members[name]
        offset, size = spans[name]
        if size != expected["size"]:
            raise IntegrityError(f"{path}: member {name!r} has {size} bytes; manifest.members expects "
                                 f"{expected['size']}. The package was altered or truncated; rebuild it.")
        digest = _sha256(mm, offset, size)
        if digest != expected["sha256"].lower():
            raise IntegrityError(f"{path}: member {name!r} has SHA-256 {digest}; manifest.members expects "
                                 f"{expected['sha256']}. The package was altered; rebuild it.")


def _sha256(mm, offset: int, size: int) -> str:
    """Hash in chunks through a memoryview: no copy, and hashlib releases the GIL on large buffers."""
    h = hashlib.sha256()
    if size:
        view = memoryview(mm)
        try:
            for start in range(offset, offset + size, _HASH_CHUNK):
                h.update(view[start:min(start + _HASH_CHUNK, offset + size)])
        finally:
            view.release()
    return h.hexdigest()
