"""The closed set of errors tcexport raises for a user's mistake or a bad archive.

Every message names the object at fault, what was expected, what was found, and how to fix it.
The exporter raises subclasses of these too, so one ``except TcError`` catches everything a user can cause.
"""

from __future__ import annotations

import json


def clip(value, limit: int = 120) -> str:
    """A value for a message, as JSON and cut short: a hostile archive's field can be megabytes long."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


class TcError(Exception):
    """Base of every error tcexport raises on purpose; ``exit_code`` is what the CLIs exit with."""

    exit_code = 1


class FormatError(TcError):
    """The archive is malformed, altered, or of a format version this loader cannot read."""

    exit_code = 3


class IntegrityError(FormatError):
    """An archive member is missing, extra, or its bytes do not match the manifest's SHA-256."""


class VersionError(FormatError):
    """The archive's format major version is newer than this loader understands."""


class UnloadablePackageError(FormatError):
    """tcexport was about to write a package its own loader refuses (the loader's checks on the finished bytes,
    or a call at the model's example inputs, failed). Nothing was written: an existing file is untouched. A bug in
    tcexport: the message carries the loader's own error (``cause``) to report."""

    def __init__(self, message: str, *, path: str, cause: str):
        super().__init__(message)
        self.path = path
        self.cause = cause


class SignatureError(IntegrityError):
    """Trusted keys are configured and the package does not carry a valid signature by one of them: it is
    unsigned, signed by another key, or altered after signing (any altered byte counts). Also raised when the
    trusted keys themselves cannot be read, or cryptography is missing: a loader told to check signatures never
    skips the check."""

    exit_code = 8


class TargetError(TcError):
    """The package has no kernels this machine can run (wrong device, GPU arch or CPU ISA)."""

    exit_code = 4


class GuardError(TcError):
    """A call's inputs break one of the package's guards. Raised before any kernel runs.

    Attributes name the input, the dimension and the symbol involved (``None`` where not applicable),
    what the package allows and what the call passed.
    """

    exit_code = 5

    def __init__(self, message: str, *, input: str | None = None, dim: int | None = None,
                 symbol: str | None = None, expected: object = None, got: object = None,
                 rule: str | None = None):
        super().__init__(message)
        self.input = input
        self.dim = dim
        self.symbol = symbol
        self.expected = expected
        self.got = got
        self.rule = rule


class ArityError(GuardError):
    """Wrong number of inputs, or a keyword input the model does not have."""


class RankError(GuardError):
    """An input has the wrong number of dimensions."""


class DtypeError(GuardError):
    """An input has the wrong element type (the loader never casts silently)."""


class StaticDimError(GuardError):
    """A dimension the package was built for as a constant has another size."""


class SymbolRangeError(GuardError):
    """A dynamic dimension is outside its symbol's range."""


class SymbolConflictError(GuardError):
    """Two dimensions that share a symbol, or a derived dimension, disagree."""


class RelationError(GuardError):
    """A relation between symbols that export recorded (e.g. divisibility) does not hold."""


class WorkspaceLimitError(GuardError):
    """A call would need more scratch memory than the model was loaded to allow (``max_workspace_bytes``), or
    more than the machine could allocate. Raised before any kernel runs."""


class CacheError(TcError):
    """The kernel cache directory is unsafe to load native code from (owned by another user, writable by group
    or others, a symlink) or cannot be used."""

    exit_code = 9


class RuntimeKernelError(TcError):
    """A kernel reported a failure at run time (the message comes from the generated code)."""

    exit_code = 6


class TrainingError(TcError):
    """A training call got something it cannot use: the saved state of another model or call, or weights whose
    names, dtypes or shapes are not the package's. Raised before anything is run or written.

    ``name`` is the weight or argument at fault (``None`` where not one), ``expected`` what the package takes,
    ``got`` what the call passed.
    """

    def __init__(self, message: str, *, name: str | None = None, expected: object = None, got: object = None):
        super().__init__(message)
        self.name = name
        self.expected = expected
        self.got = got


class UnknownMethodError(TcError, KeyError):
    """``m.methods[name]`` names no method of the package (SPEC §2c). ``name`` is the one asked for, ``methods`` the
    package's. A KeyError too, so ``name in m.methods`` and ``m.methods.get(name)`` work as on any mapping. Exit 2:
    from the command line (``tcpkg run --method``) it is a usage error."""

    exit_code = 2

    def __init__(self, message: str, *, name: str, methods: list):
        super().__init__(message)
        self.name = name
        self.method = name
        self.methods = list(methods)
        self.expected = list(methods)
        self.got = name

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""
