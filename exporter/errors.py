"""Errors the exporter raises for a user's mistake; all are TcError, so the CLI maps them to exit codes."""

from __future__ import annotations

import errno as errnos
import os

from tcexport.formats.errors import TcError


class ExportError(TcError):
    exit_code = 10


class ModelFileError(ExportError):
    """MODEL.py is missing, fails to import, or lacks `model` / `example_inputs`, or they have the wrong type."""

    exit_code = 11


class DynamicSpecError(ExportError):
    """A `--dynamic` spec or a `dynamic_shapes` entry is malformed or names an input/dim that does not exist.
    ``symbol``, ``expected`` and ``got`` are set where one symbol is at fault (e.g. a misspelt one)."""

    exit_code = 12

    def __init__(self, message: str, *, symbol: str | None = None, expected: object = None, got: object = None):
        super().__init__(message)
        self.symbol = symbol
        self.expected = expected
        self.got = got


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


class DuplicateRuleError(ExportError):
    """Two lowering rule tables composed into one pipeline's table (exporter/lower/core.py) define the same op:
    a bug in tcexport, not in the model. ``op`` names the op, ``modules`` the two rule modules."""

    def __init__(self, message: str, *, op: str, modules: tuple[str, str]):
        super().__init__(message)
        self.op = op
        self.modules = modules


class BuildError(ExportError):
    """The C++ compiler failed on generated code: a bug in tcexport, reported with the log and the source path."""

    exit_code = 15


class OutputError(ExportError):
    """Something the export writes (the package, the ONNX file, the --dump folder, a build folder) could not be
    written: a read-only or full file system, no permission, a path through a file. ``path`` is what was being
    written, ``errno`` the system's error number. Nothing half-written is left, and an existing file is untouched."""

    exit_code = 17

    def __init__(self, message: str, *, path: str, errno: int | None):
        super().__init__(message)
        self.path = path
        self.errno = errno


# errno -> (what it means for the path, the fix); {folder} is the path's folder, {elsewhere} how to pick another
_OUTPUT_CAUSES = {
    errnos.EROFS: ("its file system is mounted read-only", "{elsewhere}, on a writable file system"),
    errnos.EACCES: ("permission denied: this user may not write in {folder}",
                    "make {folder} writable for this user (chmod/chown), or {elsewhere}"),
    errnos.ENOSPC: ("no space left on the device", "free space there, or {elsewhere}"),
    errnos.EDQUOT: ("the disk quota is exceeded", "free space there, or {elsewhere}"),
    errnos.EFBIG: ("the file would exceed the largest file this process may write (ulimit -f) or the file system "
                   "allows", "raise the limit (ulimit -f unlimited), or {elsewhere}"),
    errnos.ENOTDIR: ("a part of the path is a file, not a folder", "rename that file, or {elsewhere}"),
    errnos.EISDIR: ("a folder of that name is in the way", "remove that folder, or {elsewhere}"),
    errnos.ENOENT: ("its folder {folder} does not exist", "create it (mkdir -p {folder}), or {elsewhere}"),
    errnos.ENAMETOOLONG: ("the name is too long for the file system", "{elsewhere}, with a shorter path"),
    errnos.EIO: ("the device reported an I/O error", "check the disk, or {elsewhere}"),
}
_OUTPUT_CAUSES[errnos.EPERM] = _OUTPUT_CAUSES[errnos.EACCES]


def output_error(what: str, path, err: OSError, elsewhere: str) -> OutputError:
    """The OutputError for ``err`` raised while writing ``what`` at ``path``; ``elsewhere`` says how to write it
    somewhere else (e.g. "pass another path with -o"). The folder named is the one the failing call wrote in."""
    folder = os.path.dirname(os.path.abspath(err.filename if isinstance(err.filename, str) else path))
    code = err.errno
    name = errnos.errorcode.get(code, str(code))
    meaning, fix = _OUTPUT_CAUSES.get(code, (err.strerror or str(err), "check the path, or {elsewhere}"))
    fields = {"folder": folder, "elsewhere": elsewhere}
    return OutputError(f"cannot write {what} {path}: {meaning.format(**fields)} ({name}: {err.strerror or err}). "
                       f"Fix: {fix.format(**fields)}.", path=str(path), errno=code)


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
