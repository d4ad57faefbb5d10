"""Package: a built package in memory (manifest + members), written to a `.tcpkg` archive by archive.py.

The exporter fills it (exporter/package/build.py); this layer only writes it, over formats/ alone, so it needs
neither torch nor sympy nor the exporter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tcexport.formats.manifest import Manifest

from .archive import write_archive_digest


@dataclass
class Package:
    """A built package in memory: ``save(path)`` writes it atomically and deterministically."""

    manifest: Manifest
    members: dict
    timings: dict
    onnx: bytes | None = None  # the model as ONNX, when the export asked for it
    warnings: tuple = ()       # what export demanded and tcexport accepted (e.g. a divisibility guard)
    digest: str | None = None  # the package digest of the archive ``save`` wrote last (SPEC §7)
    reference: object = None   # what the package computes when that is not the model itself (--precision); not saved
    check: Callable | None = None  # ``check(archive)`` run by ``save`` on the finished bytes (the exporter's call)

    def save(self, path, sign_key=None, check=None) -> Path:
        """Write the archive atomically; ``sign_key`` (an ed25519 private key: PEM path or bytes) signs it. The
        loader's checks run on the bytes before the rename, then ``check(archive)`` (default: the package's own
        ``check``), see archive.loader_check."""
        written, self.digest = write_archive_digest(Path(path), self.manifest, self.members, sign_key=sign_key,
                                                    check=check if check is not None else self.check)
        return written
