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
    """torch.export could not capture the model (data-dependent control flow, a constraint violation, ...).
    ``torch_log`` holds what torch logged and said in full (its graph dump included), for ``--dump``."""

    exit_code = 13
    torch_log: str | None = None


class DataDependentError(CaptureError):
    """The model's control flow or a size depends on a tensor's values (``if x.sum() > 0:``, ``.item()``,
    ``nonzero()``), which an ahead-of-time graph cannot follow. ``file``/``line``/``code`` name the user's line,
    ``expr`` is the value-dependent expression torch met, ``fixes`` the rewrites that exist for it."""

    def __init__(self, message: str, *, file: str | None, line: int | None, code: str | None, expr: str,
                 fixes: tuple[str, ...] = ()):
        super().__init__(message)
        self.file = file
        self.line = line
        self.code = code
        self.expr = expr
        self.fixes = fixes


class UnsupportedOpError(ExportError):
    """The lowering has no rule for an op (or for this use of it). Names the op and the user's source line;
    ``file``/``line`` are that line's parts. A graph with several such ops raises one error for all of them:
    ``ops`` lists every one (each an UnsupportedOpError), ``op``/``source`` are the first's."""

    exit_code = 14

    def __init__(self, message: str, *, op: str, source: str | None = None, file: str | None = None,
                 line: int | None = None, ops: list | None = None):
        super().__init__(message)
        self.op = op
        self.source = source
        self.file = file
        self.line = line
        self.ops = ops if ops is not None else [self]


def unsupported_ops_error(errors: list[UnsupportedOpError]) -> UnsupportedOpError:
    """One error for every unsupported op of a graph, each with its line, so a user fixes them in one round."""
    if len(errors) == 1:
        return errors[0]
    lines = "\n".join(f"  - {e.op}" + (f" at {e.source}" if e.source else "") for e in errors)
    first = errors[0]
    return UnsupportedOpError(f"cannot export {len(errors)} ops (or uses of them) that have no lowering yet:\n"
                              f"{lines}\nRewrite those lines with supported ops, or file an issue with this message.",
                              op=first.op, source=first.source, file=first.file, line=first.line, ops=list(errors))


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


class MethodError(ExportError):
    """A package's methods (several named entry points, formats/methods.py) cannot be built as asked: a bad method
    name or declaration, an option that cannot keep methods (``--backward``, ``--onnx``, ``--precision``), a
    ``--dynamic METHOD:SPEC`` naming no method, or methods that disagree about a buffer. ``method`` names the
    method at fault (None where the whole set is), ``expected``/``got`` say what was wanted and what came."""

    exit_code = 18

    def __init__(self, message: str, *, method: str | None = None, expected: object = None, got: object = None):
        super().__init__(message)
        self.method = method
        self.expected = expected
        self.got = got


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


class ExampleSizeOneError(SpecializedDimError):
    """A dim declared dynamic has size 1 in the example inputs: torch.export treats a size-1 example dim as the
    constant 1 (broadcasting makes 1 special), so the dim cannot stay dynamic. The fix is an example of size 2
    or more, not a change to the model; ``expected``/``got`` say so in numbers."""

    def __init__(self, message: str, *, input: str | None, dim: int | None, symbol: str, reason: str):
        super().__init__(message, input=input, dim=dim, symbol=symbol, value=1, reason=reason)
        self.expected = ">= 2"
        self.got = 1
