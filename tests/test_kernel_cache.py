"""The kernel library is loaded from the bytes that were hashed: no check/use gap, no foreign cache directory,
no symlink followed (each scenario runs in a fresh process, since a library loaded once stays loaded)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loader_helpers import KERNEL_FILE, compile_c
from tcexport.formats.errors import CacheError
from tcexport.loader import load
from tcexport.loader.native_cpu import cached_library_fd

FOREIGN_C = r"""
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>
__attribute__((constructor)) static void foreign(void) { close(creat(MARKER, 0600)); }
int32_t tc_abi_version(void) { return 1; }
const char* tc_abi_descriptor(int64_t* size) { *size = 7; return "foreign"; }
"""


def _foreign(tmp_path) -> tuple[bytes, str]:
    marker = tmp_path / "foreign-code-ran"
    return compile_c(tmp_path, FOREIGN_C, "foreign", f'-DMARKER="{marker}"'), str(marker)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_swapping_the_cached_file_during_loads_never_runs_foreign_code(package, tmp_path):
    """A thread keeps renaming a foreign library over the cache entry while the main thread loads it again and
    again; every load must get the verified library, and the foreign one's constructor must never run. (The
    loader used to hash the file by path and then dlopen the path: 59 of 398 loads ran the foreign code.)"""
    foreign, marker = _foreign(tmp_path)
    (tmp_path / "foreign.so").write_bytes(foreign)
    cache = tmp_path / "cache"
    code = f"""
import ctypes, os, threading
from tcexport.loader.archive import open_archive
from tcexport.loader.native_cpu import cached_library_fd
archive = open_archive({str(package)!r})
data = archive.read({KERNEL_FILE!r})
sha = archive.manifest.members[{KERNEL_FILE!r}]["sha256"]
foreign = open({str(tmp_path / "foreign.so")!r}, "rb").read()
cache = {str(cache)!r}
os.close(cached_library_fd(data, sha, cache))
entry = os.path.join(cache, "kernels", sha + ".so")
stop, swaps = False, 0
def swapper():
    global swaps
    while not stop:
        tmp = entry + ".swap"
        with open(tmp, "wb") as f:
            f.write(foreign)
        os.chmod(tmp, 0o500)
        os.replace(tmp, entry)
        swaps += 1
t = threading.Thread(target=swapper, daemon=True)
t.start()
ours = 0
try:
    for _ in range(400):
        fd = cached_library_fd(data, sha, cache)   # kept open: its /proc path stays this library's
        lib = ctypes.CDLL(f"/proc/self/fd/{{fd}}")
        lib.tc_abi_descriptor.restype = ctypes.c_void_p
        size = ctypes.c_int64()
        text = ctypes.string_at(lib.tc_abi_descriptor(ctypes.byref(size)), size.value)
        ours += text != b"foreign"
finally:
    stop = True
    t.join()
print(ours, swaps)
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    ours, swaps = map(int, r.stdout.split())
    assert ours == 400 and swaps > 0
    assert not os.path.exists(marker)


def test_world_writable_cache_directory_is_refused(package, tmp_path):
    kernels = tmp_path / "cache" / "kernels"
    kernels.mkdir(parents=True)
    kernels.chmod(0o777)
    with pytest.raises(CacheError, match=r"writable by group and others \(mode 777\)"):
        cached_library_fd(b"x", "0" * 64, tmp_path / "cache")


def test_cache_directory_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making a directory owned by another user needs root")
    kernels = tmp_path / "cache" / "kernels"
    kernels.mkdir(parents=True, mode=0o700)
    os.chown(kernels, 65534, 65534)
    with pytest.raises(CacheError, match="owned by uid 65534"):
        cached_library_fd(b"x", "0" * 64, tmp_path / "cache")


def test_symlinked_cache_directory_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "kernels").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CacheError, match="not a symlink"):
        cached_library_fd(b"x", "0" * 64, tmp_path / "cache")


def test_planted_symlink_is_not_followed(package, tmp_path):
    foreign, marker = _foreign(tmp_path)
    target = tmp_path / "foreign.so"
    target.write_bytes(foreign)
    sha = load(package).manifest.members[KERNEL_FILE]["sha256"]
    kernels = tmp_path / "cache" / "kernels"
    kernels.mkdir(parents=True, mode=0o700)
    (kernels / f"{sha}.so").symlink_to(target)
    code = f"""
import numpy as np
import tcexport.loader as L
m = L.load({str(package)!r}, cache_dir={str(tmp_path / "cache")!r})
print(m(np.ones((2, 4), np.float32)).sum())
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) == 2 * 4 + 2 * 10
    assert not os.path.exists(marker)
    assert not (kernels / f"{sha}.so").is_symlink() and target.read_bytes() == foreign


def test_default_load_writes_no_cache(package, tmp_path):
    """Without cache_dir the library goes through a sealed memfd: nothing is written to disk."""
    env = {**os.environ, "TCEXPORT_CACHE": str(tmp_path / "untouched"), "HOME": str(tmp_path / "home")}
    code = f"""
import numpy as np, tcexport.loader as L
print(L.load({str(package)!r})(np.ones((1, 4), np.float32)).sum())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "untouched").exists() and not (tmp_path / "home").exists()
