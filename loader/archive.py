"""Open a `.tcpkg` archive and verify every byte that matters before anything else may use it.

``open_archive`` reads the zip directory by hand (formats/container.py), checks the package digest (the SHA-256
of ``manifest.json``, which lists every other member's SHA-256, named by the attestation in the archive comment) and,
when trusted
keys are given, its signature, all before the manifest is parsed; then it hashes every member. The members the
loader runs or maps (weights, kernel libraries, cubins) are read into private anonymous memory and hashed there,
so the bytes that were verified are the bytes that get used: truncating, rewriting or replacing the file while a
model serves changes nothing and cannot raise SIGBUS. Source and ONNX members are only hashed; reading one later
re-reads and re-verifies it. An Archive that exists has passed every integrity rule of formats/SPEC.md.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import pathlib
import stat
import zlib
from concurrent.futures import ThreadPoolExecutor

from tcexport.formats import attestation as att
from tcexport.formats.container import Entry, read_directory
from tcexport.formats.errors import FormatError, IntegrityError, SignatureError, TargetError
from tcexport.formats.manifest import MANIFEST_NAME, Manifest, parse_manifest

MAX_MANIFEST_BYTES = 16 * 1024 * 1024
ATTESTED_SINCE = (1, 7)   # packages of this format version and later must carry an attestation
_CHUNK = 16 * 1024 * 1024
_ALIGN = 64


class Archive:
    """A verified archive: its manifest, the package digest and the trusted keys that signed it, and the kept
    members' bytes in one private, writable anonymous mapping (``memory``) that nothing outside this process can
    change. Views into it (``view``, and the weights' numpy arrays) hold the mapping's buffer, so it cannot be
    closed under them."""

    def __init__(self, path: pathlib.Path, manifest: Manifest, manifest_bytes: bytes, entries: dict,
                 memory: mmap.mmap | None, spans: dict, attestation: att.Attestation | None, signed_by: tuple):
        self.path = path
        self.manifest = manifest
        self.manifest_bytes = manifest_bytes  # as stored: the package digest is their SHA-256
        self.attestation = attestation        # None: a package older than 1.7 has none
        self.memory = memory
        self.signed_by = signed_by    # keyids of the trusted keys whose signatures verified
        self._entries = entries       # name -> container.Entry (where it is in the file)
        self._spans = spans           # name -> (offset, size) in ``memory``, for the kept members

    @property
    def digest(self) -> str | None:
        """The package digest (SHA-256 of manifest.json), or None for a package from before format 1.7."""
        return self.attestation.digest if self.attestation is not None else None

    def names(self) -> list[str]:
        return [n for n in self._entries if n != MANIFEST_NAME]

    def file_span(self, name: str) -> tuple[int, int]:
        """Absolute file offset and size of a member's stored bytes (for tools and tests; the loader never
        reads the file again for what it keeps)."""
        e = self._entry(name)
        return e.offset, e.size

    def view(self, name: str) -> memoryview:
        """A zero-copy view of a kept member's verified bytes; other members are read and verified again."""
        span = self._spans.get(name)
        if span is None:
            return memoryview(self.read(name))
        offset, size = span
        return memoryview(self.memory)[offset:offset + size]

    def release(self) -> bool:
        """Give back the private copy of the kept members (a CUDA model, once its weights are on the device and
        its cubins loaded, needs no host copy); later reads re-read the file and verify it again. False, and
        nothing given back, while views of the memory are still in use."""
        if self.memory is None:
            return True
        try:
            self.memory.close()
        except BufferError:
            return False
        self.memory, self._spans = None, {}
        return True

    def find(self, name: str, needle: bytes, start: int = 0) -> int:
        """Where ``needle`` first occurs in a member at or after ``start`` (-1 if nowhere), without a copy."""
        span = self._spans.get(name)
        if span is None:
            return self.read(name).find(needle, start)
        offset, size = span
        at = self.memory.find(needle, offset + start, offset + size)
        return at - offset if at >= 0 else -1

    def read(self, name: str) -> bytes:
        span = self._spans.get(name)
        if span is not None:
            offset, size = span
            return self.memory[offset:offset + size]
        return self._reread(name)

    def _entry(self, name: str) -> Entry:
        e = self._entries.get(name)
        if e is None or name == MANIFEST_NAME:
            raise FormatError(f"{self.path}: archive has no member {name!r} (members: {sorted(self.names())})")
        return e

    def _reread(self, name: str) -> bytes:
        """A member this Archive did not keep, read from the file again and checked against the manifest: the
        file may have been replaced since it was opened."""
        e, want = self._entry(name), self.manifest.members[name]
        try:
            with open(self.path, "rb") as f:
                f.seek(e.offset)
                data = f.read(e.size)
        except OSError as err:
            raise FormatError(f"{self.path}: cannot read member {name!r} again: {err.strerror or err}") from None
        if len(data) != want["size"] or hashlib.sha256(data).hexdigest() != want["sha256"].lower():
            raise IntegrityError(f"{self.path}: member {name!r} changed on disk after the package was opened; "
                                 f"expected SHA-256 {want['sha256']}. Replace packages atomically, and open the "
                                 f"new one.")
        return data

    def __repr__(self) -> str:
        return f"Archive({str(self.path)!r}, model={self.manifest.model!r}, members={len(self.names())})"


def open_archive(path, *, trusted_keys=None) -> Archive:
    """Open ``path``, check its zip structure and names, its package digest and (with ``trusted_keys``: paths,
    key bytes or key objects) its signature, parse the manifest, and verify every member.

    Raises FormatError (malformed), VersionError (unreadable format version), IntegrityError (a member or the
    manifest missing, extra, or altered) and, with trusted keys, SignatureError for anything that keeps the
    package from verifying as signed by one of them.
    """
    path = pathlib.Path(path)
    trusted = att.trusted_keys(trusted_keys) if trusted_keys is not None else None
    with _File(path) as f:
        try:
            directory = read_directory(f.read_at, f.size, str(path))
            entries = {e.name: e for e in directory.entries}
            manifest_bytes = _small_member(f, entries, MANIFEST_NAME, MAX_MANIFEST_BYTES, path)
            attestation = _attestation(directory.comment, manifest_bytes, path)
            if trusted is not None and attestation is None:
                raise SignatureError(f"{path}: the package is unsigned (it has no attestation; packages before "
                                     f"format {ATTESTED_SINCE[0]}.{ATTESTED_SINCE[1]} have none)")
            signed_by = tuple(att.verify(attestation, trusted, str(path))) if trusted is not None else ()
        except FormatError as e:
            if trusted is None or isinstance(e, SignatureError):
                raise
            raise SignatureError(f"{path}: the package's signature cannot be verified: {e}") from None
        manifest = _parse(manifest_bytes, path)
        if attestation is None and manifest.format_version >= ATTESTED_SINCE:
            raise IntegrityError(f"{path}: a format {manifest.format_version[0]}.{manifest.format_version[1]} "
                                 f"package must carry an attestation (its digest, in the archive comment); it is "
                                 f"missing. The package was altered; rebuild it.")
        try:
            memory, spans = _verify_members(f, manifest, entries, path)
        except IntegrityError as e:
            if trusted is None:
                raise
            raise SignatureError(f"{e} It was signed by a trusted key, so it was altered after signing.") from None
    return Archive(path, manifest, manifest_bytes, entries, memory, spans, attestation, signed_by)


class _File:
    """The package's open file, read by offset; the path is opened once, so every read sees one file."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise FormatError(f"{path}: cannot read the package: {e.strerror or e}") from None
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(self.fd)
            raise FormatError(f"{path}: is not a regular file; a package is one .tcpkg file")
        self.size = st.st_size

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def read_at(self, offset: int, count: int) -> bytes:
        parts, done = [], 0
        while done < count:
            try:
                part = os.pread(self.fd, min(count - done, _CHUNK), offset + done)
            except OSError as e:
                raise FormatError(f"{self.path}: cannot read the package: {e.strerror or e}") from None
            if not part:
                break
            parts.append(part)
            done += len(part)
        return b"".join(parts)

    def read_into(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            try:
                n = os.preadv(self.fd, [view[done:]], offset + done)
            except OSError as e:
                raise FormatError(f"{self.path}: cannot read the package: {e.strerror or e}") from None
            if n == 0:
                raise IntegrityError(f"{self.path}: the file ended while it was being verified; it was truncated "
                                     f"or replaced in place. Replace packages atomically (write, then rename).")
            done += n


def _small_member(f: _File, entries: dict, name: str, limit: int, path) -> bytes:
    e = entries.get(name)
    if e is None:
        raise FormatError(f"{path}: no {name} member; this is not a tcpkg archive")
    if e.size > limit:
        raise FormatError(f"{path}: {name} is {e.size} bytes; the limit is {limit} bytes")
    data = f.read_at(e.offset, e.size)
    if len(data) != e.size or zlib.crc32(data) != e.crc:
        raise IntegrityError(f"{path}: {name} does not match its zip CRC-32; the package is damaged or was "
                             f"altered. Rebuild it.")
    return data


def _attestation(raw: bytes, manifest_bytes: bytes, path) -> att.Attestation | None:
    """The attestation, its subject checked against the manifest's bytes; None for a package from before 1.7
    (no archive comment)."""
    if not raw:
        return None
    attestation = att.parse(raw, str(path))
    digest = att.package_digest(manifest_bytes)
    if digest != attestation.digest:
        raise IntegrityError(f"{path}: {MANIFEST_NAME} has SHA-256 {digest}; the package digest in "
                             f"{att.ATTESTATION_NAME} is {attestation.digest}. The manifest was altered; rebuild "
                             f"the package.")
    return attestation


def _parse(manifest_bytes: bytes, path) -> Manifest:
    try:
        return parse_manifest(manifest_bytes)
    except FormatError as e:
        raise type(e)(f"{path}: {e}") from None


def _verify_members(f: _File, manifest: Manifest, entries: dict, path) -> tuple[mmap.mmap | None, dict]:
    """Every member but the manifest is listed with its size and SHA-256, and nothing else is present; the kept
    members end up in private memory, hashed there."""
    present = set(entries) - {MANIFEST_NAME}
    listed = set(manifest.members)
    for name in sorted(present - listed):
        raise IntegrityError(f"{path}: member {name!r} is in the archive but not listed in manifest.members; "
                             f"expected only listed members. The package was altered; rebuild it.")
    for name in sorted(listed - present):
        raise IntegrityError(f"{path}: member {name!r} is listed in manifest.members but missing from the "
                             f"archive. The package is incomplete; rebuild it.")
    for name in sorted(listed):
        want = manifest.members[name]["size"]
        if entries[name].size != want:
            raise IntegrityError(f"{path}: member {name!r} has {entries[name].size} bytes; manifest.members "
                                 f"expects {want}. The package was altered or truncated; rebuild it.")
    skipped = set(manifest.sources) | ({manifest.onnx["file"]} if manifest.onnx else set())
    kept = [n for n in sorted(listed) if n not in skipped]
    spans, total = {}, 0
    for name in kept:
        spans[name] = (total, entries[name].size)
        total += -(-entries[name].size // _ALIGN) * _ALIGN
    try:
        memory = _private_memory(total) if total else None
    except (OSError, MemoryError) as e:
        raise TargetError(f"{path}: this machine cannot hold the {total} bytes of the package's weights and "
                          f"kernels in memory ({type(e).__name__}); free memory or load it elsewhere.") from None
    digests = _hash_all(f, [(n, entries[n], spans.get(n)) for n in sorted(listed)], memory)
    for name in sorted(listed):
        want = manifest.members[name]["sha256"].lower()
        if digests[name] != want:
            raise IntegrityError(f"{path}: member {name!r} has SHA-256 {digests[name]}; manifest.members expects "
                                 f"{want}. The package was altered; rebuild it.")
    return memory, spans


def _private_memory(size: int) -> mmap.mmap:
    memory = mmap.mmap(-1, size)  # anonymous and private: no file behind it to change, truncate or SIGBUS
    if size >= 1 << 21 and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            memory.madvise(mmap.MADV_HUGEPAGE)  # fewer page faults while it is filled
        except OSError:
            pass
    return memory


def _hash_all(f: _File, jobs: list, memory: mmap.mmap | None) -> dict[str, str]:
    """SHA-256 of each ``(name, entry, span)``: read in chunks (into ``memory`` at the span for a kept member,
    into one of two buffers otherwise) while a second thread hashes the chunk before (hashlib releases the GIL),
    so a load costs about one pass over the file rather than a read and then a hash."""
    buffers = [bytearray(_CHUNK), bytearray(_CHUNK)]
    target = memoryview(memory) if memory is not None else None
    digests = {}
    try:
        with ThreadPoolExecutor(1) as pool:
            turn = 0
            for name, entry, span in jobs:
                h, pending = hashlib.sha256(), None
                for start in range(0, entry.size, _CHUNK):
                    n = min(_CHUNK, entry.size - start)
                    if span is not None:
                        view = target[span[0] + start:span[0] + start + n]
                    else:
                        view, turn = memoryview(buffers[turn])[:n], 1 - turn
                    f.read_into(view, entry.offset + start)
                    if pending is not None:
                        pending.result()
                    pending = pool.submit(h.update, view)
                if pending is not None:
                    pending.result()
                digests[name] = h.hexdigest()
    finally:
        if target is not None:
            target.release()
    return digests
