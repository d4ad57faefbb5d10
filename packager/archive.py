"""Write a `.tcpkg` archive: a deterministic, uncompressed, 64-byte-aligned zip (formats/SPEC.md).

The container's bytes are formats/container.py's; this module decides what goes in: the manifest (with every
member's SHA-256 filled in), the attestation naming the manifest's own digest (signed when a key is given), and
the members in name order (the attestation is the zip's archive comment). The same manifest and members always give a byte-identical file (ed25519 signatures
are deterministic too).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Mapping

from tcexport.formats import attestation as att
from tcexport.formats.container import write_package
from tcexport.formats.errors import FormatError, TcError, UnloadablePackageError
from tcexport.formats.manifest import MANIFEST_NAME, Manifest, parse_manifest
from tcexport.formats.members import check_member_name, sha256_hex

RESERVED = (MANIFEST_NAME,)


def write_archive(path, manifest: Manifest, members: Mapping[str, bytes], sign_key=None) -> pathlib.Path:
    """Write ``manifest`` and ``members`` to ``path`` atomically; return the path (see write_archive_digest)."""
    return write_archive_digest(path, manifest, members, sign_key)[0]


def write_archive_digest(path, manifest: Manifest, members: Mapping[str, bytes],
                         sign_key=None, check=None) -> tuple[pathlib.Path, str]:
    """Write ``manifest`` and ``members`` to ``path`` atomically; return the path and the package digest.

    ``manifest.members`` is filled in here (SHA-256 and size of every member), so callers pass a manifest whose
    ``members`` is empty or stale. The result is parsed back before anything is written, so a package that the
    loader would reject is never produced: the finished bytes go through the loader's own ``open_archive`` (zip
    structure, digest, signature, manifest, every member's hash) before the rename, then through ``check`` (given
    the opened ``loader.archive.Archive``; e.g. a call at the example inputs). Either failing raises UnloadablePackageError and leaves an
    existing ``path`` untouched. ``sign_key`` (a PEM path or bytes of an ed25519 private key) signs it.
    """
    names = sorted(members)
    for name in names:
        check_member_name(name)
        if name in RESERVED:
            raise FormatError(f"archive member {name!r} is written from the manifest; do not pass it in members")
    listed = {n: {"sha256": sha256_hex(members[n]), "size": len(members[n])} for n in names}
    manifest = dataclasses.replace(manifest, members=listed)
    manifest_bytes = manifest.dumps()
    parse_manifest(manifest_bytes)
    statement = att.unsigned(manifest_bytes, manifest.format_version)
    if sign_key is not None:
        statement = att.sign(statement, att.load_private_key(sign_key))
    written = write_package(path, manifest_bytes, statement.to_bytes(), [(n, members[n]) for n in names],
                            check=lambda tmp: loader_check(tmp, path, check))
    return written, statement.digest


def loader_check(tmp: pathlib.Path, path, check=None) -> None:
    """The loader's checks on the temp file about to become ``path``, then ``check(archive)`` on what the loader
    opened; a failure of either is an UnloadablePackageError naming ``path`` and the loader's own words."""
    from tcexport.loader.archive import open_archive

    try:
        archive = open_archive(tmp)   # no trusted keys: the package may be signed later (tcpkg sign)
        if check is not None:
            check(archive)
    except UnloadablePackageError:
        raise
    except TcError as e:  # the loader's FormatError, GuardError, TargetError, ...: a refusal
        _refused(path, e)


def _refused(path, e: Exception):
    raise UnloadablePackageError(
        f"tcexport built a package that its own loader refuses, so {path} was not written (an existing file there "
        f"is untouched): {type(e).__name__}: {e}. This is a tcexport bug; please report it with the model file "
        "and this message.", path=str(path), cause=f"{type(e).__name__}: {e}") from e
