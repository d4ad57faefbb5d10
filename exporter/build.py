"""Build: generated C++ → one shared library per CPU ISA level, through a content-addressed cache.

The cache key is the hash of the source, the compiler's identity and the flags, so a rebuild of an unchanged
model costs nothing and a CI job can keep the cache between runs. Builds of several ISA levels run in parallel.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tcexport.formats.files import write_atomically

from .errors import BuildError


@dataclass(frozen=True)
class IsaLevel:
    name: str        # also the -march value
    requires: tuple  # /proc/cpuinfo flags a CPU needs to run it


# Most capable first: the loader takes the first one the CPU supports.
ISA_LEVELS = (
    IsaLevel("x86-64-v4", ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "avx512f", "avx512bw",
                           "avx512cd", "avx512dq", "avx512vl")),
    IsaLevel("x86-64-v3", ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe")),
    IsaLevel("x86-64", ()),
)
ISA_FLAGS = {"x86-64-v4": ("-mprefer-vector-width=512",)}  # GCC otherwise keeps 256-bit vectors on AVX-512
LIBRARIES = ("libgomp.so.1",)
BASE_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
              "-fno-plt", "-static-libstdc++", "-static-libgcc", "-Wall", "-Wno-unused-variable",
              "-Wno-unused-but-set-variable", "-Wno-unknown-pragmas", "-Wl,--build-id=none", "-ffile-prefix-map=/=/")


def default_cache_dir() -> Path:
    return Path(os.environ.get("TCEXPORT_CACHE") or Path.home() / ".cache" / "tcexport") / "build"


def compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise BuildError("no C++ compiler found: install g++ (Debian: apt-get install g++) or set CXX")
    return cxx


@lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else cxx


def build_one(source: str, isa: IsaLevel, cache_dir: Path) -> bytes:
    cxx = compiler()
    flags = list(BASE_FLAGS) + [f"-march={isa.name}", "-mtune=generic"] + list(ISA_FLAGS.get(isa.name, ()))
    key = hashlib.sha256("\0".join([source, compiler_version(cxx), *flags]).encode()).hexdigest()
    cached = cache_dir / f"{key}.so"
    if cached.is_file():
        return cached.read_bytes()
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tcexport-build-") as tmp:
        src = Path(tmp) / "model.cpp"
        src.write_text(source)
        out = Path(tmp) / "model.so"
        # relative paths: the temp dir's name must not reach the binary (byte-identical rebuilds)
        proc = subprocess.run([cxx, *flags, src.name, "-o", out.name], capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            keep = cache_dir / f"failed-{key[:16]}.cpp"
            keep.write_text(source)
            raise BuildError(f"the C++ compiler failed on generated code for {isa.name} (a tcexport bug; "
                             f"please report it with this log). Source kept at {keep}\n{proc.stderr[-4000:]}")
        data = out.read_bytes()
    write_atomically(cached, data)
    return data


def build_all(source: str, isas=ISA_LEVELS, cache_dir: Path | None = None) -> dict[str, bytes]:
    cache_dir = cache_dir or default_cache_dir()
    with ThreadPoolExecutor(max_workers=max(1, min(len(isas), os.cpu_count() or 1))) as pool:
        futures = {isa.name: pool.submit(build_one, source, isa, cache_dir) for isa in isas}
        return {name: f.result() for name, f in futures.items()}
