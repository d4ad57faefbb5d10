"""Which keys a loader trusts: the ``trusted_keys`` a caller passes, else ``TCEXPORT_TRUSTED_KEYS``.

Read at load time, never at import. A server sets the variable once (paths to PEM public keys, separated by
``os.pathsep``); from then on an unsigned package, one signed by another key, or one altered after signing is a
SignatureError before any of its code loads. A variable that is set but names no key is an error, not "trust
nothing": a typo in a deployment must not switch the check off.
"""

from __future__ import annotations

import os

from tcexport.formats.errors import SignatureError

ENV = "TCEXPORT_TRUSTED_KEYS"


def trusted_key_sources(trusted_keys=None) -> list | None:
    """The key sources to verify against (paths, key bytes or key objects), or None when signatures are not
    required."""
    if trusted_keys is not None:
        if isinstance(trusted_keys, (str, bytes, bytearray, os.PathLike)):
            return [trusted_keys]
        return list(trusted_keys)
    value = os.environ.get(ENV)
    if value is None:
        return None
    paths = [p for p in value.split(os.pathsep) if p.strip()]
    if not paths:
        raise SignatureError(f"{ENV} is set but names no key file; set it to the paths of trusted public keys "
                             f"(PEM, separated by {os.pathsep!r}), or unset it to load unsigned packages")
    return paths
