"""Pick, verify and dlopen the CPU kernel bundle for this machine (C ABI 1, formats/SPEC.md).

Bundles are tried in manifest order (the packager lists the fastest first); the first whose ``requires`` flags
this CPU has wins. The library is loaded from the archive's verified bytes through a descriptor (a sealed memfd,
or a private cache directory where memfds cannot be executed), so nothing can swap it between the hash check and
the load; only allow-listed system libraries are loaded besides it, its entry point is the ABI's, and its compiled
interface descriptor must match the manifest before anything is called.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import pathlib
import platform
import threading
import warnings
from dataclasses import dataclass, replace

from tcexport.formats.abi import (CPU_ENTRY, CPU_ISA_REQUIRES, DESCRIPTOR_PREFIX, DESCRIPTOR_SYMBOL,
                                  DESCRIPTOR_VERSION, MAX_DESCRIPTOR_BYTES, SYSTEM_LIBRARIES, Interface, descriptor)
from tcexport.formats.abi import check_descriptor as check_descriptor_bytes
from tcexport.formats.abi import method_entry
from tcexport.formats.errors import CacheError, FormatError, IntegrityError, TargetError, VersionError
from tcexport.formats.manifest import CPU_ABI_VERSION, KernelBundle, Manifest
from tcexport.formats.private_files import fd_sha256, open_verified, private_dir, write_private

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
    cdll: ctypes.CDLL
    run: object                 # the ctypes function for bundle.entry; no argtypes: pass ctypes objects (see _entry)
    blas: tuple                 # function addresses, in bundle.blas order

    @property
    def openmp(self) -> bool:
        """Its threads are libgomp's (libraries built before the runtime had its own pool): see _ForkGuard."""
        return "libgomp.so.1" in self.bundle.libraries


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


def _requires(k: KernelBundle) -> set[str]:
    """What the bundle needs of the CPU: its ``requires``, and for a level this loader knows its own table's
    flags, so that an edited ``requires`` cannot make it load AVX-512 code on a CPU without it (SIGILL)."""
    return set(k.requires) | set(CPU_ISA_REQUIRES.get(k.isa, ()))


def _runs_here(k: KernelBundle, flags: set[str] | None, arch: str) -> bool:
    if not _isa_arch_ok(k.isa, arch):
        return False
    need = _requires(k)
    return not need or (flags is not None and need <= flags)


def _isa_arch(isa: str) -> str:
    """The architecture an isa name is for: "x86-64-v3" -> "x86-64", "aarch64-sve" -> "aarch64"."""
    return "x86-64" if isa.startswith("x86-64") else isa.split("-")[0]


def _isa_arch_ok(isa: str, arch: str) -> bool:
    return _isa_arch(isa) == arch


def _missing(k: KernelBundle, flags: set[str] | None, arch: str) -> str:
    if not _isa_arch_ok(k.isa, arch):
        return f"an {_isa_arch(k.isa)} CPU"
    if flags is None:
        return f"CPU flags {sorted(_requires(k))} (this machine's flags could not be read)"
    return f"CPU flags {sorted(_requires(k) - flags)}"


def _describe(bundles: list[KernelBundle]) -> str:
    return ", ".join(f"{k.isa} (requires {' '.join(k.requires) or 'nothing'})" for k in bundles) or "no cpu bundles"


def _no_bundle_message(manifest: Manifest, bundles: list[KernelBundle], flags, arch: str) -> str:
    targets = sorted({k.target for k in manifest.kernels})
    return (f"package {manifest.model!r} has no cpu kernels this {arch} machine can run. "
            f"Package targets: {targets or 'none'}; cpu bundles: {_describe(bundles)}. "
            + "; ".join(f"{k.isa} needs {_missing(k, flags, arch)}" for k in bundles)
            + ". Rebuild with a target for this machine (baseline x86-64 runs on every x86-64 CPU).")


# -- loading the library from verified bytes --------------------------------------------------------------


class _Loaded:
    """Libraries this process has dlopen'd, by the SHA-256 of their bytes. A dlopen'd library is process-wide by
    nature; this table makes a second load of the same bytes reuse it instead of mapping another copy, and it keeps
    each library's descriptor open for the life of the process, so that its /proc/self/fd path is never reused by
    another library (glibc returns an already-loaded library whose path matches, without reading the file)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.libraries: dict[str, ctypes.CDLL] = {}
        self.fds: dict[str, int] = {}


_LOADED = _Loaded()


def default_cache_dir() -> pathlib.Path:
    """Read at call time, not import time, so a process can set TCEXPORT_CACHE before loading."""
    env = os.environ.get("TCEXPORT_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "tcexport"


def load_library(archive: Archive, bundle: KernelBundle, cache_dir=None) -> ctypes.CDLL:
    """dlopen the bundle's library from the archive's verified bytes, with no gap between the hash check and the
    load: the bytes go into a sealed memfd (nothing can change them after sealing) or, where that cannot be
    executed or ``cache_dir`` asks for a disk cache, into a private cache directory; either way they are hashed
    through the descriptor that is then loaded as /proc/self/fd/N."""
    sha = archive.manifest.members[bundle.file]["sha256"].lower()
    with _LOADED.lock:
        cdll = _LOADED.libraries.get(sha)
        if cdll is not None:
            return cdll
        data = archive.view(bundle.file)
        fd, cdll = (_from_memfd(data, sha, bundle) if cache_dir is None else (None, None))
        if cdll is None:
            fd, cdll = _from_cache(data, sha, bundle, cache_dir)
        _LOADED.libraries[sha], _LOADED.fds[sha] = cdll, fd
        return cdll


def _from_memfd(data, sha: str, bundle: KernelBundle) -> tuple[int | None, ctypes.CDLL | None]:
    """(fd, library) from a sealed memfd, or (None, None) where memfds are missing or not executable here
    (``vm.memfd_noexec``): the disk cache is the fallback."""
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return None, None
    try:
        fd = os.memfd_create(f"tcexport-{sha[:16]}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return None, None
    try:
        view, done = memoryview(data), 0
        while done < len(view):
            done += os.write(fd, view[done:])
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
                    | fcntl.F_SEAL_SEAL)
        _check_fd(fd, sha, f"kernel library {bundle.file!r}")
        return fd, ctypes.CDLL(f"/proc/self/fd/{fd}")
    except OSError:  # not executable here (vm.memfd_noexec): the disk cache takes over
        os.close(fd)
        return None, None
    except BaseException:
        os.close(fd)
        raise


def _from_cache(data, sha: str, bundle: KernelBundle, cache_dir) -> tuple[int, ctypes.CDLL]:
    directory = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    fd = cached_library_fd(data, sha, directory)
    if not os.path.isdir("/proc/self/fd"):  # no descriptor paths here: the checked path is the best there is
        return fd, _dlopen(str(directory / "kernels" / f"{sha}.so"), bundle)
    return fd, _dlopen(f"/proc/self/fd/{fd}", bundle)


def cached_library_fd(data, sha: str, directory: pathlib.Path) -> int:
    """A descriptor of ``<directory>/kernels/<sha>.so`` whose bytes, read through it, hash to ``sha``: the cached
    file if it is intact and ours, else ``data`` written there first (formats/private_files.py)."""
    kernels = pathlib.Path(directory) / "kernels"
    dir_fd = private_dir(kernels)
    try:
        name = f"{sha}.so"
        fd = open_verified(dir_fd, name, sha)
        if fd is None:
            try:
                fd = write_private(dir_fd, name, data)  # the descriptor of the file written, not of the name
            except OSError as e:
                raise CacheError(f"cannot write the kernel cache {kernels}: {e.strerror or e}. Set TCEXPORT_CACHE or "
                                 f"pass cache_dir= to a writable directory.") from None
            try:
                _check_fd(fd, sha, f"kernel cache entry {kernels / name}")
            except IntegrityError:
                os.close(fd)
                raise
        return fd
    finally:
        os.close(dir_fd)


def _check_fd(fd: int, sha: str, what: str) -> None:
    """The bytes about to be loaded, read through their descriptor, are the verified ones."""
    found = fd_sha256(fd)
    if found != sha:
        raise IntegrityError(f"{what}: the bytes about to be loaded have SHA-256 {found}, not the verified {sha}. "
                             f"Nothing was loaded.")


def _dlopen(path: str, bundle: KernelBundle) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise TargetError(f"cpu kernel bundle {bundle.isa!r} ({bundle.file}) failed to load: {e}") from None


def check_libraries(bundle: KernelBundle) -> None:
    """Each library the kernels link against must load, else say which package installs it. Only the loader's own
    list of system sonames is ever loaded (formats/abi.py; the manifest parser refuses any other name)."""
    for soname in bundle.libraries:
        if soname not in SYSTEM_LIBRARIES["cpu"]:
            raise FormatError(f"cpu kernel bundle {bundle.isa!r} names library {soname[:120]!r}, which is not one "
                              f"of the system libraries a package may need ({list(SYSTEM_LIBRARIES['cpu'])})")
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
    """Choose, check and dlopen the kernel bundle for this machine, and check that the library was built for the
    manifest's interface."""
    bundle = choose_bundle(archive.manifest, isa)
    if bundle.abi != CPU_ABI_VERSION:
        raise VersionError(f"cpu kernel bundle {bundle.isa!r} uses C ABI {bundle.abi}; this loader speaks ABI "
                           f"{CPU_ABI_VERSION}. Upgrade tcexport, or rebuild the package with this version.")
    check_libraries(bundle)
    blas = blas_pointers(bundle, num_threads)
    expected = descriptor(Interface.of_manifest(archive.manifest, bundle.blas), bundle.isa)
    check_embedded_descriptor(archive, bundle, expected)
    FORK.watch()
    cdll = load_library(archive, bundle, cache_dir)
    run = _entry(cdll, bundle)
    check_descriptor(cdll, bundle, archive.manifest, expected)
    return NativeLibrary(bundle, cdll, run, blas)


def check_embedded_descriptor(archive: Archive, bundle: KernelBundle, expected: bytes) -> None:
    """Before the library is loaded (loading runs its initialisers, which are compiled for its ISA level), find
    its descriptor in its bytes, where the compiler put the string literal, and compare: a library filed under
    another bundle or built for another interface is refused without being mapped."""
    start = archive.find(bundle.file, DESCRIPTOR_PREFIX)
    if start < 0:
        if archive.manifest.format_version >= DESCRIPTOR_VERSION:
            raise FormatError(f"{archive.path}: kernel library {bundle.file!r} has no {DESCRIPTOR_SYMBOL}, which "
                              f"every format {DESCRIPTOR_VERSION[0]}.{DESCRIPTOR_VERSION[1]} library carries; "
                              f"rebuild the package.")
        return
    end = archive.find(bundle.file, b"\0", start)
    data = archive.view(bundle.file)
    found = bytes(data[start:end if 0 <= end - start <= MAX_DESCRIPTOR_BYTES else start + MAX_DESCRIPTOR_BYTES])
    check_descriptor_bytes(found, expected, f"{archive.path}: {bundle.file}")


def _entry(cdll: ctypes.CDLL, bundle: KernelBundle):
    """The ABI-checked entry point ``int32_t tc_run(const tc_context*, const int64_t* symbols, void* const* inputs,
    void* const* weights, void* const* outputs, void* workspace)`` (its name fixed by the ABI, never taken from
    the manifest), deliberately without argtypes: ctypes then passes ctypes objects as they are instead of running
    each argument's from_param check (~0.5 us a call). Callers pass only ctypes objects: byref(context), a c_int64
    array, three c_void_p arrays, and a c_void_p or None; a bare Python int would go through as a 32-bit C int."""
    try:
        version_fn, run = cdll.tc_abi_version, getattr(cdll, CPU_ENTRY)
    except AttributeError as e:
        raise FormatError(f"kernel library {bundle.file!r} lacks a required symbol ({e}); "
                          f"it must export tc_abi_version and {CPU_ENTRY}. Rebuild the package.") from None
    version_fn.restype, version_fn.argtypes = ctypes.c_int32, []
    found = version_fn()
    if found != bundle.abi:
        raise FormatError(f"kernel library {bundle.file!r} reports C ABI {found}; the manifest says {bundle.abi}. "
                          f"Rebuild the package.")
    run.restype, run.argtypes = ctypes.c_int32, None
    return run


def for_method(native: NativeLibrary, name: str) -> NativeLibrary:
    """The library with ``run`` the entry point of method ``name`` (SPEC §2c): its name the ABI's for the method,
    which the library's descriptor (checked when it was loaded) lists; same calling rules as ``tc_run``."""
    entry = method_entry(name)
    run = getattr(native.cdll, entry, None)
    if run is None:
        raise FormatError(f"kernel library {native.bundle.file!r} lacks method {name!r}'s entry point {entry}; "
                          f"rebuild the package")
    run.restype, run.argtypes = ctypes.c_int32, None
    return replace(native, run=run)


def check_descriptor(cdll: ctypes.CDLL, bundle: KernelBundle, manifest: Manifest, expected: bytes) -> None:
    """The library's own interface descriptor (formats/abi.py), as it returns it, must equal the one the manifest
    implies; a package from before the descriptor (format < 1.7) has none and is taken at its manifest's word."""
    fn = getattr(cdll, DESCRIPTOR_SYMBOL, None)
    if fn is None:
        if manifest.format_version >= DESCRIPTOR_VERSION:
            raise FormatError(f"kernel library {bundle.file!r} has no {DESCRIPTOR_SYMBOL}, which every format "
                              f"{DESCRIPTOR_VERSION[0]}.{DESCRIPTOR_VERSION[1]} library carries; rebuild the "
                              f"package.")
        return
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.POINTER(ctypes.c_int64)]
    size = ctypes.c_int64(-1)
    address = fn(ctypes.byref(size))
    if not address or not 0 < size.value <= MAX_DESCRIPTOR_BYTES:
        raise FormatError(f"kernel library {bundle.file!r}: {DESCRIPTOR_SYMBOL} returned {size.value} bytes; "
                          f"rebuild the package")
    check_descriptor_bytes(ctypes.string_at(address, size.value), expected, bundle.file)


# -- fork ----------------------------------------------------------------------------------------------------


class _ForkGuard:
    """For libraries whose threads are libgomp's (NativeLibrary.openmp; today's libraries run their own pool,
    which starts afresh in a forked child). GNU libgomp cannot start threads in a child forked after its thread
    pool ran in the parent: the child's
    first parallel region waits forever for threads that were not copied. So once a call has run on more than one
    thread, a forked child runs every call on one thread (correct, only slower) and says so once. The state is
    process-wide because libgomp's is."""

    def __init__(self):
        self.threads_started = False  # a call in this process ran a parallel region
        self.broken = False           # this process is a fork child of one where that happened
        self._watching = False
        self._warned = False

    def watch(self) -> None:
        if not self._watching and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)
            self._watching = True

    def _after_fork(self) -> None:
        self.broken = self.broken or self.threads_started

    def threads(self, wanted: int) -> int:
        """The thread count a call may use now; records that a parallel region runs."""
        if wanted <= 1:
            return wanted
        if self.broken:
            if not self._warned:
                self._warned = True
                warnings.warn("tcexport: this process was forked after OpenMP threads ran in its parent; GNU "
                              "libgomp cannot start threads here, so models run on one thread. Fork before the "
                              "first call, or start workers with 'spawn', to use every core.", RuntimeWarning,
                              stacklevel=3)
            return 1
        self.threads_started = True
        return wanted


FORK = _ForkGuard()
