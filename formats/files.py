"""Writing a file so that readers only ever see the old file or the complete new one, and scratch folders.

Shared by the packager (archives), the loader (its kernel cache) and the exporter (ONNX files, build cache, build
folders): a half-written file left by an interrupt or a crash is the failure every one of them must rule out.

A process killed with SIGKILL runs no cleanup, so every temp file and scratch folder carries its owner's pid in its
name and is flock'ed by it while in use; the next writer removes the ones whose pid is gone and whose lock is free.
The lock keeps a live owner's files safe where its pid means nothing here (another pid namespace sharing the
folder, e.g. two containers writing to one mounted volume); the pid keeps them safe where flock does not work.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import tempfile
from typing import BinaryIO, Callable, Iterator

try:
    import fcntl
except ImportError:  # not POSIX: no locks, and stale files are never removed (see _pid_alive)
    fcntl = None


def write_atomically(path, write: Callable[[BinaryIO], None] | bytes, mode: int | None = None,
                     check: Callable[[pathlib.Path], None] | None = None) -> pathlib.Path:
    """Write through a temp file ``.NAME.PID.RANDOM.tmp`` in ``path``'s folder, fsync, then rename over ``path``.

    ``write`` is the bytes, or a function that writes to the open file. ``check`` (given the temp file's path)
    runs after the bytes are on disk and before the rename: whatever it raises keeps the rename from happening. ``mode`` defaults to what the umask allows
    for a plain file (typically 0o644). Any exception, KeyboardInterrupt and OSError (a full disk) included,
    removes the temp file and leaves an existing ``path`` untouched. Temp files of ``path`` that a killed writer
    left are removed first.
    """
    path = pathlib.Path(path)
    directory = path.parent if str(path.parent) else pathlib.Path(".")
    if mode is None:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    remove_stale(directory, f".{path.name}.", ".", ".tmp")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=directory)
    try:
        _lock(fd)
        with os.fdopen(fd, "wb") as f:
            if isinstance(write, (bytes, bytearray, memoryview)):
                f.write(write)
            else:
                write(f)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(pathlib.Path(tmp))
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


@contextlib.contextmanager
def scratch_dir(prefix: str, parent=None) -> Iterator[pathlib.Path]:
    """A private folder ``PARENT/PREFIXPID-RANDOM`` (PARENT: the system temp folder, ``TMPDIR``), removed on exit.

    Folders of this prefix that a killed process left are removed first. Raises OSError if it cannot be made.
    """
    parent = pathlib.Path(parent or tempfile.gettempdir())
    remove_stale(parent, prefix, "-", "", folders=True)
    path = pathlib.Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
    try:
        fd = os.open(path, os.O_RDONLY)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    try:
        _lock(fd)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def remove_stale(directory, prefix: str, sep: str, suffix: str, folders: bool = False) -> list[pathlib.Path]:
    """Remove this user's entries ``PREFIX PID SEP RANDOM SUFFIX`` of ``directory`` whose process is gone and whose
    lock is free; return them. Best effort: anything that cannot be read or removed is left alone."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)" + re.escape(sep) + r"[a-z0-9_]+" + re.escape(suffix),
                         re.ASCII)
    removed: list[pathlib.Path] = []
    if os.name != "posix":
        return removed    # no pids to check (see _pid_alive)
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if m is None or not _own(entry, folders) or _pid_alive(int(m.group(1))) or _locked(entry.path):
            continue
        try:
            if folders:
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            continue     # another process removed it first, or it is not ours to remove
        removed.append(pathlib.Path(entry.path))
    return removed


def _own(entry: os.DirEntry, folder: bool) -> bool:
    """A real file (or folder), not a link, owned by this user."""
    try:
        kind_ok = entry.is_dir(follow_symlinks=False) if folder else entry.is_file(follow_symlinks=False)
        return kind_ok and entry.stat(follow_symlinks=False).st_uid == os.getuid()
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` may still be running; in doubt (another user's process, not POSIX) it is."""
    if os.name != "posix" or pid == os.getpid():
        return True       # Windows' os.kill(pid, 0) would terminate the process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _lock(fd: int) -> None:
    """Hold an exclusive flock on ``fd`` until it is closed; a file system without flock is left to the pid."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass


def _locked(path: str) -> bool:
    """Whether some live process holds the flock on ``path`` (it is in use); in doubt it is."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False   # no flock on this file system: the dead pid decides
    finally:
        os.close(fd)
    return False


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
