"""Writing a file so that readers only ever see the old file or the complete new one.

Shared by the packager (archives), the loader (its kernel cache) and the exporter (ONNX files, build cache): a
half-written file left by an interrupt or a crash is the failure every one of them must rule out.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from typing import BinaryIO, Callable


def write_atomically(path, write: Callable[[BinaryIO], None] | bytes, mode: int | None = None) -> pathlib.Path:
    """Write through a temp file in ``path``'s folder, fsync, then rename over ``path``.

    ``write`` is the bytes, or a function that writes to the open file. ``mode`` defaults to what the umask allows
    for a plain file (typically 0o644). Any exception, KeyboardInterrupt included, removes the temp file and
    leaves an existing ``path`` untouched.
    """
    path = pathlib.Path(path)
    directory = path.parent if str(path.parent) else pathlib.Path(".")
    if mode is None:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(write, (bytes, bytearray, memoryview)):
                f.write(write)
            else:
                write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)
    return path


def _fsync_dir(directory: pathlib.Path) -> None:
    """Make the rename durable; not every platform can open a directory, which is fine."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
