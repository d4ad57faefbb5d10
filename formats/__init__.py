"""The `.tcpkg` format: its spec (SPEC.md), manifest types and validation, and the expression form.

This package is the only thing the packager and the loader share. It imports neither torch nor triton.
"""

from .errors import (ArityError, DtypeError, FormatError, GuardError, IntegrityError, RankError,
                     RelationError, RuntimeKernelError, StaticDimError, SymbolConflictError,
                     SymbolRangeError, TargetError, TcError, VersionError)
from .manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest, parse_manifest

__all__ = [
    "ArityError", "DtypeError", "FormatError", "GuardError", "IntegrityError", "RankError", "RelationError",
    "RuntimeKernelError", "StaticDimError", "SymbolConflictError", "SymbolRangeError", "TargetError", "TcError",
    "VersionError", "FORMAT_VERSION", "MANIFEST_NAME", "Manifest", "parse_manifest",
]
