"""Cache directories that native code is loaded from, and their files, with no gap between check and use.

A kernel library is only as trustworthy as the directory it sits in: another user who can write there can swap
the file between our hash check and ``dlopen``. So a cache directory must be ours (created 0700, owned by this
user, not writable by group or others, not a symlink), every operation goes through an open descriptor of it
(``dir_fd``: no path is resolved twice), entries are opened without following symlinks, and a file is hashed
through the very descriptor that is then loaded (``/proc/self/fd/N``). Shared by the loader's kernel cache and the
exporter's build cache.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import secrets
import stat

from .errors import CacheError

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def private_dir(path) -> int:
    """An open descriptor of ``path``, created 0700 if missing, after checking it is a directory of this user's
    that nobody else may write to; CacheError otherwise, saying what to do."""
    path = pathlib.Path(path)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError as e:
        raise CacheError(f"cannot use {path} as a cache directory: {e.strerror or e} (a cache directory must be a "
                         f"real directory, not a symlink). Set TCEXPORT_CACHE, or pass cache_dir=, to a directory "
                         f"of your own.") from None
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif st.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit)
        problem = f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    if problem:
        os.close(fd)
        raise CacheError(f"cache directory {path} {problem}: someone else could put code there that this process "
                         f"would load. Use a directory only you can write (chmod 700 {path}), or set "
                         f"TCEXPORT_CACHE / cache_dir= to one.")
    return fd


def open_private(dir_fd: int, name: str) -> int | None:
    """A read descriptor of ``name`` in the directory if it is a regular file of this user's that no one else may
    write; else None. A symlink or a file of another owner in its place is removed (the directory is ours, so
    nothing of anyone else's is lost)."""
    try:
        fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError:  # ELOOP: a symlink planted at the name; never followed
        _remove(dir_fd, name)
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        _remove(dir_fd, name)
        return None
    return fd


def open_verified(dir_fd: int, name: str, sha256: str) -> int | None:
    """``open_private``, and only if the file's bytes (read through that descriptor) hash to ``sha256``."""
    fd = open_private(dir_fd, name)
    if fd is not None and fd_sha256(fd) != sha256:
        os.close(fd)
        return None
    return fd


def write_private(dir_fd: int, name: str, data, mode: int = 0o500) -> int:
    """Write ``name`` atomically inside the directory (a fresh temp file, O_EXCL, never following a link; fsync;
    the final mode; a rename over ``name``) and return a read descriptor of the file written: whatever happens
    to the name afterwards, that descriptor reads these bytes."""
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            view, done = memoryview(data), 0
            while done < len(view):
                done += os.write(fd, view[done:])
            os.fsync(fd)
            os.fchmod(fd, mode)
            reader = _reopen_read_only(fd)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.close(reader)
            raise
        return reader
    except BaseException:
        _remove(dir_fd, tmp)
        raise


def _reopen_read_only(fd: int) -> int:
    """A read-only descriptor of the same file (so none that loads code can write it); where /proc is missing,
    a duplicate of ``fd``."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | _O_CLOEXEC)
    except OSError:
        return os.dup(fd)


def fd_sha256(fd: int) -> str:
    """SHA-256 of a file's whole content, read through ``fd`` from offset 0 (its position is not used)."""
    h, offset = hashlib.sha256(), 0
    while True:
        chunk = os.pread(fd, 1 << 22, offset)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)
        offset += len(chunk)


def fd_bytes(fd: int) -> bytes:
    parts, offset = [], 0
    while True:
        chunk = os.pread(fd, 1 << 22, offset)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        offset += len(chunk)


def _remove(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
