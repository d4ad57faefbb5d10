"""Archive member names and digests: the rules the packager writes by and the loader checks against.

A member name is a relative POSIX path. The rule is strict on purpose: names that could escape an
extraction directory (zip-slip) or mean different files on different systems are rejected, not fixed.
"""

from __future__ import annotations

import hashlib
import re

from .errors import FormatError

MAX_NAME_LENGTH = 1024
_DRIVE_RE = re.compile(r"^[A-Za-z]:")


def check_member_name(name: object) -> str:
    """Return ``name`` if it is a safe relative POSIX path; raise FormatError saying what is wrong."""
    if not isinstance(name, str) or not name:
        raise FormatError(f"archive member name {name!r}: expected a non-empty relative path")
    problem = _name_problem(name)
    if problem:
        raise FormatError(f"archive member name {name!r}: {problem}; member names must be relative POSIX "
                          f"paths like 'kernels/cpu-x86-64-v3.so' (no '..', no leading '/', no '\\')")
    return name


def _name_problem(name: str) -> str | None:
    if len(name) > MAX_NAME_LENGTH:
        return f"longer than {MAX_NAME_LENGTH} characters"
    if any(ord(c) < 0x20 or c == "\x7f" for c in name):
        return "contains a NUL or control character"
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/"):
        return "is absolute"
    if _DRIVE_RE.match(name):
        return "starts with a drive letter"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"has a {part!r} path component" if part else "has an empty path component"
    return None


def sha256_hex(data) -> str:
    """SHA-256 of a bytes-like object (memoryviews hash without a copy)."""
    return hashlib.sha256(data).hexdigest()
