"""Build: generated C++ → one shared library per CPU ISA level, through a content-addressed cache.

The cache key is the hash of the source, the compiler's identity and the flags, so a rebuild of an unchanged
model costs nothing and a CI job can keep the cache between runs; an entry is re-verified by content before it is
reused (build_cache.py, which also holds what this build shares with the CUDA one: the cache folder, the
build folders, the warnings). Builds of several ISA levels run in parallel. Each is compiled with its level's name as
``TC_ISA``, which the library's interface descriptor repeats (formats/abi.py). The cache is an optimisation: one
that cannot be made, read or written costs a warning on stderr, never the export.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from tcexport.formats.abi import CPU_ISA_REQUIRES, ISA_MACRO, ISA_PLACEHOLDER

from tcexport.exporter.build_cache import BuildCache, build_folder, default_cache_dir, print_warning, warn_once
from tcexport.exporter.errors import BuildError


@dataclass(frozen=True)
class IsaLevel:
    name: str        # also the -march value
    requires: tuple  # /proc/cpuinfo flags a CPU needs to run it


# Most capable first: the loader takes the first one the CPU supports. The flags are the loader's own table, so
# that what a package says a level requires is what the loader checks.
ISA_LEVELS = tuple(IsaLevel(name, requires) for name, requires in CPU_ISA_REQUIRES.items())
ISA_FLAGS = {"x86-64-v4": ("-mprefer-vector-width=512",)}  # GCC otherwise keeps 256-bit vectors on AVX-512
LIBRARIES = ()  # threads are the runtime's own pool (runtime/pool.h): libstdc++ is static, libc has pthreads
BASE_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp-simd", "-pthread", "-fno-math-errno", "-fno-trapping-math",
              "-fno-plt", "-static-libstdc++", "-static-libgcc", "-Wall", "-Wno-unused-variable",
              "-Wno-unused-but-set-variable", "-Wno-unknown-pragmas", "-Wl,--build-id=none", "-ffile-prefix-map=/=/")


def compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise BuildError("no C++ compiler found: install g++ (Debian: apt-get install g++) or set CXX")
    return cxx


@lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else cxx


def isa_flags(isa: IsaLevel) -> list[str]:
    """The flags that make one ISA level's library: its -march, and its name as TC_ISA for the descriptor."""
    return [f"-march={isa.name}", "-mtune=generic", *ISA_FLAGS.get(isa.name, ()), f'-D{ISA_MACRO}="{isa.name}"']


def build_one(source: str, isa: IsaLevel, cache: BuildCache | None, warn: Callable[[str], None] | None = None,
              descriptor: bytes = b"") -> bytes:
    """``cache`` None: build without one. ``descriptor`` (formats/abi.py, with the isa as ``ISA_PLACEHOLDER``) is what the
    library must contain; a cached library that does not is rebuilt."""
    cxx = compiler()
    flags = list(BASE_FLAGS) + isa_flags(isa)
    key = hashlib.sha256("\0".join([source, compiler_version(cxx), *flags]).encode()).hexdigest()
    expected = descriptor.replace(f'"{ISA_PLACEHOLDER}"'.encode(), f'"{isa.name}"'.encode())
    check = (lambda data: data[:4] == b"\x7fELF" and expected in data)
    hit = cache.get(key, ".so", check) if cache is not None else None
    if hit is not None:
        return hit[0]
    with build_folder("tcexport-build-") as tmp:
        src = Path(tmp) / "model.cpp"
        src.write_text(source)
        out = Path(tmp) / "model.so"
        # relative paths: the temp dir's name must not reach the binary (byte-identical rebuilds)
        proc = subprocess.run([cxx, *flags, src.name, "-o", out.name], capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            raise BuildError(f"the C++ compiler failed on generated code for {isa.name} (a tcexport bug; "
                             f"please report it with this log). {_keep_failed(cache, key, source)}\n"
                             f"{proc.stderr[-4000:]}")
        data = out.read_bytes()
    if not check(data):
        raise BuildError(f"the library built for {isa.name} does not contain its interface descriptor (a tcexport "
                         f"bug; please report it)")
    if cache is not None:
        cache.put(key, ".so", data)
    return data


def build_all(source: str, isas=ISA_LEVELS, cache_dir: Path | None = None,
              warn: Callable[[str], None] | None = None, descriptor: bytes = b"",
              on_built: Callable[[int, int], None] | None = None) -> dict[str, bytes]:
    """One library per ISA level, built in parallel (cached by content); ``on_built(done, total)`` as each ends."""
    warn = warn_once(warn or print_warning)
    cache = BuildCache.open(cache_dir or default_cache_dir(), warn)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(len(isas), os.cpu_count() or 1))) as pool:
            futures = {isa.name: pool.submit(build_one, source, isa, cache, warn, descriptor) for isa in isas}
            if on_built is not None:
                for done, _ in enumerate(as_completed(futures.values()), 1):
                    on_built(done, len(futures))
            return {name: f.result() for name, f in futures.items()}
    finally:
        if cache is not None:
            cache.close()


def _keep_failed(cache: BuildCache | None, key: str, source: str) -> str:
    """Keep the failing source for the bug report, in the cache if it takes it."""
    if cache is not None:
        keep = cache.directory / f"failed-{key[:16]}.cpp"
        try:
            keep.write_text(source)
            return f"Source kept at {keep}"
        except OSError:
            pass
    return "Rerun with --dump DIR to keep the source"
