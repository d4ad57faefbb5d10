"""Pick, extract, verify and dlopen the CPU kernel bundle for this machine (C ABI 1, formats/SPEC.md).

Bundles are tried in manifest order (the packager lists the fastest first); the first whose
``requires`` flags this CPU has wins. The shared library is written to a content-addressed cache
(file name = its SHA-256) because dlopen needs a path; a cached file is re-hashed before every use,
so a tampered cache entry is rewritten rather than loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import platform
from dataclasses import dataclass

from tcexport.formats.errors import FormatError, IntegrityError, TargetError, VersionError
from tcexport.formats.files import write_atomically
from tcexport.formats.manifest import CPU_ABI_VERSION, KernelBundle, Manifest

from .archive import Archive

MAX_BLAS = 8
BLAS_SYMBOLS = {"sgemm": "scipy_cblas_sgemm", "dgemm": "scipy_cblas_dgemm"}
LIBRARY_PACKAGES = {  # soname -> (Debian/Ubuntu package, RHEL/Fedora package)
    "libgomp.so.1": ("libgomp1", "libgomp"),
    "libstdc++.so.6": ("libstdc++6", "libstdc++"),
    "libm.so.6": ("libc6", "glibc"),
}


class TcContext(ctypes.Structure):
    """``tc_context`` of C ABI 1; one per call, so concurrent calls never share the error buffer."""
    _fields_ = [
        ("abi_version", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("blas", ctypes.c_void_p * MAX_BLAS),
        ("error", ctypes.c_void_p),      # char*: the caller's buffer
        ("error_size", ctypes.c_int64),
    ]


@dataclass
class NativeLibrary:
    """A loaded, ABI-checked kernel library and the BLAS pointers its context needs."""
    bundle: KernelBundle
    path: pathlib.Path
    cdll: ctypes.CDLL
    run: object                 # the ctypes function for bundle.entry; no argtypes: pass ctypes objects (see _entry)
    blas: tuple                 # function addresses, in bundle.blas order


def default_cache_dir() -> pathlib.Path:
    """Read at call time, not import time, so a process can set TCEXPORT_CACHE before loading."""
    env = os.environ.get("TCEXPORT_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "tcexport"


def cpu_flags() -> set[str] | None:
    """This CPU's feature flags as /proc/cpuinfo spells them; None where they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        return None
    return None


def machine_arch() -> str:
    m = platform.machine().lower()
    return "x86-64" if m in ("x86_64", "amd64") else m


def choose_bundle(manifest: Manifest, isa: str | None = None, flags: set[str] | None = None,
                  arch: str | None = None) -> KernelBundle:
    """The bundle to run here, or a TargetError listing what the package has and what this machine is."""
    arch = arch or machine_arch()
    flags = cpu_flags() if flags is None else flags
    bundles = [k for k in manifest.kernels if k.target == "cpu"]
    usable = [k for k in bundles if _runs_here(k, flags, arch)]
    if isa is not None:
        named = [k for k in bundles if k.isa == isa]
        if not named:
            raise TargetError(f"package {manifest.model!r} has no cpu kernel bundle with isa {isa!r}; "
                              f"it has: {_describe(bundles)}. Pass one of those, or isa=None to choose automatically.")
        if named[0] not in usable:
            raise TargetError(f"cpu kernel bundle {isa!r} needs {_missing(named[0], flags, arch)}, which this "
                              f"{arch} machine lacks. Pass isa=None to choose automatically.")
        return named[0]
    if usable:
        return usable[0]
    raise TargetError(_no_bundle_message(manifest, bundles, flags, arch))


def _runs_here(k: KernelBundle, flags: set[str] | None, arch: str) -> bool:
    if not _isa_arch_ok(k.isa, arch):
        return False
    return not k.requires or (flags is not None and set(k.requires) <= flags)


def _isa_arch(isa: str) -> str:
    """The architecture an isa name is for: "x86-64-v3" -> "x86-64", "aarch64-sve" -> "aarch64"."""
    return "x86-64" if isa.startswith("x86-64") else isa.split("-")[0]


def _isa_arch_ok(isa: str, arch: str) -> bool:
    return _isa_arch(isa) == arch


def _missing(k: KernelBundle, flags: set[str] | None, arch: str) -> str:
    if not _isa_arch_ok(k.isa, arch):
        return f"an {_isa_arch(k.isa)} CPU"
    if flags is None:
        return f"CPU flags {list(k.requires)} (this machine's flags could not be read)"
    return f"CPU flags {sorted(set(k.requires) - flags)}"


def _describe(bundles: list[KernelBundle]) -> str:
    return ", ".join(f"{k.isa} (requires {' '.join(k.requires) or 'nothing'})" for k in bundles) or "no cpu bundles"


def _no_bundle_message(manifest: Manifest, bundles: list[KernelBundle], flags, arch: str) -> str:
    targets = sorted({k.target for k in manifest.kernels})
    return (f"package {manifest.model!r} has no cpu kernels this {arch} machine can run. "
            f"Package targets: {targets or 'none'}; cpu bundles: {_describe(bundles)}. "
            + "; ".join(f"{k.isa} needs {_missing(k, flags, arch)}" for k in bundles)
            + ". Rebuild with a target for this machine (baseline x86-64 runs on every x86-64 CPU).")


# -- extraction and loading -------------------------------------------------------------------------------


def extract(archive: Archive, bundle: KernelBundle, cache_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Write the bundle's library to the cache as <sha256>.so (atomically) unless a verified copy is there."""
    expected = archive.manifest.members[bundle.file]["sha256"].lower()
    directory = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    directory = directory / "kernels"
    target = directory / f"{expected}.so"
    if target.is_file() and _file_sha256(target) == expected:
        return target
    data = archive.read(bundle.file)
    if hashlib.sha256(data).hexdigest() != expected:   # the file may have changed since open_archive
        raise IntegrityError(f"{archive.path}: member {bundle.file!r} changed on disk after it was verified; "
                             f"expected SHA-256 {expected}. Do not modify a package while loading it.")
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomically(target, data, mode=0o555)
    except OSError as e:
        raise TargetError(f"cannot write the kernel cache {directory}: {e.strerror or e}. Set TCEXPORT_CACHE "
                          f"or pass cache_dir= to a writable directory.") from None
    return target


def _file_sha256(path: pathlib.Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def check_libraries(bundle: KernelBundle) -> None:
    """Each library the kernels link against must load, else say which package installs it."""
    for soname in bundle.libraries:
        try:
            ctypes.CDLL(soname)
        except OSError:
            deb, rhel = LIBRARY_PACKAGES.get(soname, (None, None))
            how = (f"install it with `apt-get install {deb}` (Debian/Ubuntu) or `dnf install {rhel}` (RHEL/Fedora)"
                   if deb else "install the system package that provides it")
            raise TargetError(f"cpu kernel bundle {bundle.isa!r} needs the shared library {soname}, which "
                              f"cannot be loaded on this machine: {how}.") from None


def blas_pointers(bundle: KernelBundle, num_threads: int) -> tuple:
    """Addresses of the BLAS routines the bundle names, from scipy-openblas32 (LP64, 32-bit ints)."""
    if not bundle.blas:
        return ()
    if len(bundle.blas) > MAX_BLAS:
        raise FormatError(f"kernel bundle {bundle.isa!r} names {len(bundle.blas)} BLAS routines; ABI "
                          f"{CPU_ABI_VERSION} passes at most {MAX_BLAS}")
    unknown = [r for r in bundle.blas if r not in BLAS_SYMBOLS]
    if unknown:
        raise FormatError(f"kernel bundle {bundle.isa!r} needs BLAS routine(s) {unknown}; this loader provides "
                          f"{sorted(BLAS_SYMBOLS)}. Upgrade tcexport.")
    lib = _openblas()
    # The generated code splits large products across its own OpenMP threads and calls the BLAS from each;
    # a second, spinning OpenBLAS pool on the same cores only steals time from it.
    lib.scipy_openblas_set_num_threads(ctypes.c_int(1))
    return tuple(ctypes.cast(getattr(lib, BLAS_SYMBOLS[r]), ctypes.c_void_p).value for r in bundle.blas)


def _openblas() -> ctypes.CDLL:
    try:
        import scipy_openblas32
    except ImportError:
        raise TargetError("this package calls BLAS, which the loader takes from scipy-openblas32; "
                          "install it with `pip install scipy-openblas32`") from None
    path = os.path.join(scipy_openblas32.get_lib_dir(), f"lib{scipy_openblas32.get_library()}.so")
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise TargetError(f"cannot load OpenBLAS from {path}: {e}. Reinstall scipy-openblas32.") from None


def load(archive: Archive, *, isa: str | None = None, cache_dir=None, num_threads: int = 1) -> NativeLibrary:
    """Choose, extract, check and dlopen the kernel bundle for this machine."""
    bundle = choose_bundle(archive.manifest, isa)
    if bundle.abi != CPU_ABI_VERSION:
        raise VersionError(f"cpu kernel bundle {bundle.isa!r} uses C ABI {bundle.abi}; this loader speaks ABI "
                           f"{CPU_ABI_VERSION}. Upgrade tcexport, or rebuild the package with this version.")
    check_libraries(bundle)
    blas = blas_pointers(bundle, num_threads)
    path = extract(archive, bundle, cache_dir)
    try:
        cdll = ctypes.CDLL(str(path))
    except OSError as e:
        raise TargetError(f"cpu kernel bundle {bundle.isa!r} ({bundle.file}) failed to load: {e}") from None
    return NativeLibrary(bundle, path, cdll, _entry(cdll, bundle), blas)


def _entry(cdll: ctypes.CDLL, bundle: KernelBundle):
    """The ABI-checked entry point ``int32_t run(const tc_context*, const int64_t* symbols, void* const* inputs,
    void* const* weights, void* const* outputs, void* workspace)``, deliberately without argtypes: ctypes then
    passes ctypes objects as they are instead of running each argument's from_param check (~0.5 us a call).
    Callers pass only ctypes objects: byref(context), a c_int64 array, three c_void_p arrays, and a c_void_p
    or None; a bare Python int would go through as a 32-bit C int."""
    try:
        version_fn, run = cdll.tc_abi_version, getattr(cdll, bundle.entry)
    except AttributeError as e:
        raise FormatError(f"kernel library {bundle.file!r} lacks a required symbol ({e}); "
                          f"it must export tc_abi_version and {bundle.entry}. Rebuild the package.") from None
    version_fn.restype, version_fn.argtypes = ctypes.c_int32, []
    found = version_fn()
    if found != bundle.abi:
        raise FormatError(f"kernel library {bundle.file!r} reports C ABI {found}; the manifest says {bundle.abi}. "
                          f"Rebuild the package.")
    run.restype, run.argtypes = ctypes.c_int32, None
    return run
