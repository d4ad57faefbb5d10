"""The exporter's build cache: compiled libraries and cubins kept by the hash of what made them, re-verified by
content before every reuse, so a poisoned entry is rebuilt rather than packaged, hashed and shipped.

Each entry is a blob and a JSON record holding the blob's SHA-256 (and, for cubins, Triton's metadata). Reuse
needs all of: a private cache directory (formats/private_files.py: ours, 0700, not a symlink), a record and a
blob that are regular files of ours opened without following links, the blob's bytes hashing to the record's
SHA-256, and the caller's own content check (a C++ library must contain the interface descriptor this source
compiles in; a cubin must be for this arch and contain this kernel). Anything else is a miss. The cache is an
optimisation: one that cannot be used costs a warning, never the export.

What the C++ and the CUDA builds share lives here too, below both: where the cache is, the scratch folders a
build works in, and the one warning per build that a cache problem is worth.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterator

from tcexport.formats.errors import CacheError
from tcexport.formats.files import scratch_dir
from tcexport.formats.private_files import fd_bytes, open_private, open_verified, private_dir, write_private

from tcexport.exporter.errors import output_error

MAX_RECORD_BYTES = 1 << 20


class BuildCache:
    """One open cache directory; ``get`` and ``put`` may run from several build threads at once."""

    def __init__(self, directory: Path, dir_fd: int, warn: Callable[[str], None]):
        self.directory, self._fd, self._warn = directory, dir_fd, warn

    @classmethod
    def open(cls, directory: Path, warn: Callable[[str], None]) -> "BuildCache | None":
        """The cache at ``directory``, or None (build uncached) with a warning saying why."""
        try:
            return cls(Path(directory), private_dir(directory), warn)
        except CacheError as e:
            warn(f"{e} Building without the cache.")
            return None

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get(self, key: str, suffix: str, check: Callable[[bytes], bool]) -> tuple[bytes, dict] | None:
        """(blob, record) of a verified entry, or None; an entry that fails a check is removed, with a warning."""
        record = self._record(key)
        if record is None:
            return None
        name = f"{key}{suffix}"
        fd = open_verified(self._fd, name, record.get("sha256", ""))
        if fd is None:
            self._discard(key, suffix, "its bytes do not match the SHA-256 it was stored with")
            return None
        try:
            data = fd_bytes(fd)
        finally:
            os.close(fd)
        if not check(data):
            self._discard(key, suffix, "its content is not what this build produces")
            return None
        return data, record

    def put(self, key: str, suffix: str, data: bytes, record: dict | None = None) -> None:
        """Store the blob, then its record (the record is what makes an entry visible)."""
        body = {**(record or {}), "sha256": hashlib.sha256(data).hexdigest()}
        try:
            os.close(write_private(self._fd, f"{key}{suffix}", data, mode=0o400))
            os.close(write_private(self._fd, f"{key}.json", json.dumps(body, sort_keys=True).encode(), mode=0o400))
        except OSError as e:
            self._warn(f"the build cache {self.directory} cannot be written ({e.strerror or e}); building without "
                       f"caching. Set TCEXPORT_CACHE to a writable folder to keep builds between exports")

    def _record(self, key: str) -> dict | None:
        fd = open_private(self._fd, f"{key}.json")
        if fd is None:
            return None
        try:
            raw = os.pread(fd, MAX_RECORD_BYTES + 1, 0)
        finally:
            os.close(fd)
        try:
            record = json.loads(raw) if len(raw) <= MAX_RECORD_BYTES else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            record = None
        return record if isinstance(record, dict) and isinstance(record.get("sha256"), str) else None

    def _discard(self, key: str, suffix: str, why: str) -> None:
        self._warn(f"build cache entry {self.directory / (key + suffix)} was not reused: {why}; rebuilding it")
        for name in (f"{key}.json", f"{key}{suffix}"):
            try:
                os.unlink(name, dir_fd=self._fd)
            except OSError:
                pass


def default_cache_dir() -> Path:
    return Path(os.environ.get("TCEXPORT_CACHE") or Path.home() / ".cache" / "tcexport") / "build"


@contextlib.contextmanager
def build_folder(prefix: str) -> Iterator[Path]:
    """A scratch folder for one build, in the system temp folder (not the cache, which may be read-only), named
    with this pid so that the next build removes it if this process is killed. Failing to write it (a full or
    read-only temp folder) is an OutputError; other OSErrors (a missing compiler) pass through."""
    try:
        with scratch_dir(prefix) as tmp:
            yield tmp
    except OSError as e:
        parent = Path(tempfile.gettempdir())
        path = Path(e.filename) if e.filename is not None else parent / f"{prefix}{os.getpid()}-XXXXXXXX"
        if not path.is_relative_to(parent):
            raise
        raise output_error("a build folder", path, e, "set TMPDIR to a writable folder with space") from e


def print_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def warn_once(warn: Callable[[str], None]) -> Callable[[str], None]:
    """``warn`` for the first message only: every parallel build would say the same about the cache."""
    said = threading.Lock()

    def once(message: str) -> None:
        if said.acquire(blocking=False):
            warn(message)
    return once
