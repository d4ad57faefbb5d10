"""Errors the exporter raises for a user's mistake; all are TcError, so the CLI maps them to exit codes."""

from __future__ import annotations

from tcexport.formats.errors import TcError


class ExportError(TcError):
    exit_code = 10


class ModelFileError(ExportError):
    """MODEL.py is missing, fails to import, or lacks `model` / `example_inputs`, or they have the wrong type."""

    exit_code = 11


class DynamicSpecError(ExportError):
    """A `--dynamic` spec or a `dynamic_shapes` entry is malformed or names an input/dim that does not exist."""

    exit_code = 12


class CaptureError(ExportError):
    """torch.export could not capture the model (data-dependent control flow, a constraint violation, ...)."""

    exit_code = 13


class UnsupportedOpError(ExportError):
    """The lowering has no rule for an op (or for this use of it). Names the op and the user's source line."""

    exit_code = 14

    def __init__(self, message: str, *, op: str, source: str | None = None):
        super().__init__(message)
        self.op = op
        self.source = source


class BuildError(ExportError):
    """The C++ compiler failed on generated code: a bug in tcexport, reported with the log and the source path."""

    exit_code = 15


class SpecializedDimError(DynamicSpecError):
    """A dim marked dynamic was fixed to a constant by the model's code (export specialised it).

    ``input``/``dim`` name the first place the symbol was put, ``value`` the constant, ``reason`` torch's words."""

    def __init__(self, message: str, *, input: str | None, dim: int | None, symbol: str, value: int, reason: str):
        super().__init__(message)
        self.input = input
        self.dim = dim
        self.symbol = symbol
        self.value = value
        self.reason = reason
