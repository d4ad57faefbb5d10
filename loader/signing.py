"""``tcpkg sign``: add an ed25519 signature to a package without changing a byte of anything it signs.

The signature covers the package digest (the SHA-256 of manifest.json, which lists every member's SHA-256), so
signing rewrites only the attestation (the archive comment): the manifest and every member are copied as they are. The package is
verified first, so a damaged one is never signed, and the result is written atomically (in place by default).
"""

from __future__ import annotations

import pathlib

from tcexport.formats import attestation as att
from tcexport.formats.container import write_package
from tcexport.formats.errors import FormatError

from .archive import open_archive


def sign_package(path, key, output=None) -> tuple[pathlib.Path, str]:
    """Sign ``path`` with ``key`` (an ed25519 private key: PEM path or bytes) into ``output`` (default: in place);
    returns the path written and the signing key's keyid. A signature by the same key is replaced."""
    private = att.load_private_key(key)
    archive = open_archive(path)
    if archive.attestation is None:
        v = archive.manifest.format_version
        raise FormatError(f"{path}: a format {v[0]}.{v[1]} package has no attestation to sign; packages are signed "
                          f"from format 1.7 on. Rebuild it with this tcexport (tcexport ... --sign-key KEY.pem).")
    signed = att.sign(archive.attestation, private)
    members = [(name, archive.view(name)) for name in sorted(archive.names())]
    out = write_package(pathlib.Path(output) if output is not None else pathlib.Path(path), archive.manifest_bytes,
                        signed.to_bytes(), members)
    return out, signed.signatures[-1].keyid
