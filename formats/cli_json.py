"""The one JSON contract of both command lines (``tcexport --json``, ``tcpkg ... --json``), so a CI job parses
every answer, success or failure, usage errors included, with one reader (docs/cli-json.md).

Every document is one JSON object on stdout with ``schema_version`` (bumped only when a field changes meaning or
goes away; new fields may appear in any version), ``tool``, ``command``, ``ok`` and ``exit_code``. A failure
adds ``error``: an object whose keys are always all present (``null`` where they do not apply), taken from the
typed error's own attributes, never parsed from its message.
"""

from __future__ import annotations

import json
import re
from typing import Any

SCHEMA_VERSION = 1
USAGE_ERROR = 2        # argparse's exit status for a bad command line, kept by both CLIs
INTERNAL_ERROR = 70    # sysexits' EX_SOFTWARE: a bug in tcexport

# the structured fields of ``error``, in the order they are written
ERROR_FIELDS = ("type", "message", "input", "dim", "symbol", "op", "file", "line", "expected", "got", "path", "rule",
                "method")

# "model.py:12 in forward: y = x.view(-1)" (exporter/front/source_line.py) -> file, line
_SOURCE_RE = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?: in |$)")


def success(tool: str, command: str, body: dict, exit_code: int = 0) -> dict:
    """A success document: the envelope first, then the command's own fields (``body``)."""
    doc = {"schema_version": SCHEMA_VERSION, "tool": tool, "command": command, "ok": exit_code == 0,
           "exit_code": exit_code}
    doc.update({k: v for k, v in body.items() if k not in doc})
    return doc


def failure(tool: str, command: str | None, error: dict, exit_code: int, body: dict | None = None) -> dict:
    """A failure document; ``error`` as ``error_fields`` makes it, ``body`` what the command
    produced before it failed (e.g. a verify report)."""
    doc = {"schema_version": SCHEMA_VERSION, "tool": tool, "command": command, "ok": False,
           "exit_code": exit_code, "error": error}
    doc.update({k: v for k, v in (body or {}).items() if k not in doc})
    return doc


def error_fields(err: BaseException, type_name: str | None = None, message: str | None = None) -> dict:
    """The ``error`` object of a typed error: its class name, message and whichever of the structured fields it
    carries as attributes (GuardError's input/dim/symbol/expected/got, UnsupportedOpError's op and source line,
    OutputError's path, ...)."""
    fields: dict[str, Any] = dict.fromkeys(ERROR_FIELDS)
    fields["type"] = type_name or type(err).__name__
    fields["message"] = message if message is not None else str(err)
    for key in ERROR_FIELDS[2:]:
        value = getattr(err, key, None)
        if value is not None:
            fields[key] = _plain(value)
    if fields["input"] is None and fields["method"] is None and getattr(err, "name", None) is not None:
        # TrainingError names its weight (an UnknownMethodError's name is its method)
        fields["input"] = _plain(err.name)
    source = getattr(err, "source", None)
    if isinstance(source, str) and fields["file"] is None:
        m = _SOURCE_RE.match(source)
        if m:
            fields["file"], fields["line"] = m["file"], int(m["line"])
    return fields


def dumps(doc: dict) -> str:
    """The document as printed: one line, keys in a stable order, anything non-JSON as its text."""
    return json.dumps(doc, default=str)


def _plain(value):
    """A JSON-able copy of a field: tuples become lists, anything else unknown its text."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError, RecursionError):
        return str(value)
