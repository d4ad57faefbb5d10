"""What ``tcpkg`` and ``tcexport`` share on the standard library's argparse (the base install carries no CLI
framework): a parser whose usage errors become values (so ``--json`` can report them as JSON), the one place a
command's outcome is printed, ``--version``, and human-readable sizes."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence, TextIO

from tcexport.formats import cli_json
from tcexport.formats.errors import TcError


class UsageError(TcError):
    """The command line does not parse: an unknown option, a missing argument, a malformed value (exit 2)."""

    exit_code = cli_json.USAGE_ERROR

    def __init__(self, message: str, usage: str = ""):
        super().__init__(message)
        self.usage = usage


class MissingDependencyError(TcError):
    """A command's packages are not installed: ``tcexport`` in a loader-only install (the ``export`` extra),
    ``tcpkg serve`` without the ``serve`` extra. Exit 2, as a command line that cannot run."""

    exit_code = cli_json.USAGE_ERROR


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` instead of printing and exiting, so the caller decides how a usage
    error is reported (one JSON document with ``--json``, ``usage + error:`` on stderr otherwise). Subcommand
    parsers inherit the class."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        raise UsageError(f"{self.prog}: {message}", usage=self.format_usage())

    def exit(self, status: int = 0, message: str | None = None):  # --help, --version: a real exit
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)


EXIT_CODES = ("exit codes: 0 ok, 2 usage or a missing extra, 3 format/integrity, 4 target, 5 guard, 6 kernel, "
              "7 CUDA, 8 signature, 9 kernel cache, 10-18 export (11 model file, 12 dynamic spec, 13 capture, "
              "14 unsupported op, 15 build, 16 ONNX, 17 output, 18 methods), 20 --verify mismatch, 70 a tcexport bug. With "
              "--json stdout holds exactly one JSON document (schema_version 1, docs/cli-json.md).")


def version_text(prog: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{prog} {version('tcexport')}"
    except PackageNotFoundError:   # run from a source tree that was never installed
        return f"{prog} (tcexport, version unknown: not installed)"


def add_version(parser: argparse.ArgumentParser, prog: str) -> None:
    parser.add_argument("--version", action="version", version=version_text(prog),
                        help="print the version and exit")


def wants_json(argv: Sequence[str]) -> bool:
    """Whether ``--json`` is on the command line, read before parsing: a usage error must still answer in JSON."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


class Reporter:
    """Prints a command's outcome: with ``as_json`` exactly one JSON document on ``out`` (stdout), failures
    included; otherwise human text on ``out`` and errors as ``error: ...`` on ``err`` (stderr)."""

    def __init__(self, tool: str, as_json: bool, out: TextIO | None = None, err: TextIO | None = None):
        self.tool, self.as_json = tool, as_json
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.command: str | None = None

    def success(self, body: dict, text: str | None = None, exit_code: int = 0) -> int:
        if self.as_json:
            print(cli_json.dumps(cli_json.success(self.tool, self.command or "", body, exit_code)), file=self.out,
                  flush=True)
        elif text:
            print(text, file=self.out, flush=True)
        return exit_code

    def failure(self, err: BaseException, exit_code: int | None = None, *, type_name: str | None = None,
                message: str | None = None, body: dict | None = None) -> int:
        code = exit_code if exit_code is not None else getattr(err, "exit_code", cli_json.INTERNAL_ERROR)
        text = message if message is not None else str(err)
        if isinstance(err, UsageError) and not self.as_json and err.usage:
            self.err.write(err.usage)
        print(f"error: {text}", file=self.err, flush=True)
        if self.as_json:
            error = cli_json.error_fields(err, type_name, text)
            print(cli_json.dumps(cli_json.failure(self.tool, self.command, error, code, body)), file=self.out,
                  flush=True)
        return code


def stdout_closed() -> int:
    """The reader of stdout went away (``| head``): point stdout at /dev/null so the interpreter's final flush
    stays quiet, and exit as a process killed by SIGPIPE would (128 + 13)."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


def human_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``: binary units, three significant digits, exact bytes below 1 KiB."""
    if n < 1024:
        return f"{n} B"
    value, unit = float(n), "B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024:
            break
    return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"


def human_count(n: int) -> str:
    """``124439808`` -> ``124.4M`` (parameters, as model cards write them)."""
    for div, unit in ((10 ** 12, "T"), (10 ** 9, "B"), (10 ** 6, "M"), (10 ** 3, "k")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)
